// Package fleet answers for every run of a fleet what `spotagent report`
// answers for one: interruptions and their rate per cloud × instance
// type × zone, lost work, goodput and money (`spotagent fleet`,
// docs/fleet.md).
//
// Each run contributes a Run, computed from its journal by runFromJournal
// with the same accounting as `spotagent report` (journal.Account).
// Agents write one new record per session end (RecordSession), never
// rewriting an object; `fleet` merges the last summary with the records
// since and compacts them into it (Load), writing per-instance-type sums
// from which a new run's prior is read in a few small requests
// (PriorFrom). Recount rebuilds the summary from the journals.
package fleet
