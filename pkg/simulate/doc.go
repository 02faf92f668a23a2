// Package simulate replays interruption traces against checkpoint
// policies: the live scheduler (schedule.Scheduler, the same code the
// agent runs) or a fixed interval, and measures the work each wastes
// (`spotagent simulate`, docs/frequency.md). Advise calibrates it on a
// run's journal and recommends an interval and margin (`spotagent
// report`, docs/goodput.md).
package simulate
