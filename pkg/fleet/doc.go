// Package fleet answers for every run under a store prefix what
// `spotagent report` answers for one: interruptions and their rate per
// cloud × instance type × zone, lost work, goodput and money
// (`spotagent fleet`, docs/fleet.md).
//
// Each run contributes a Run, computed from its journal by runFromJournal
// with the same accounting as `spotagent report` (checkpoint.Account). A
// small Summary object at the prefix holds every run's Run; agents refresh
// their run's entry at session end with a compare-and-swap (RecordSession),
// so that `fleet` reads one object instead of every journal, and the
// scheduler of a new run starts from the fleet's observed rate (Prior).
// Recount rebuilds the summary from the journals.
package fleet
