package config

import (
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// Metrics receives the agent's measurements, in three parts by what they
// measure; pkg/metrics exports them to Prometheus (metrics.Metrics.Agent
// fills all three). A part left nil measures nothing (SetDefaults). The
// parts' methods are promoted: cfg.Metrics.Notice(…) calls NoticeMetrics'.
// Implementations must be safe for concurrent use and cheap.
type Metrics struct {
	NoticeMetrics
	CheckpointMetrics
	RunMetrics
}

// NoticeMetrics measures the cloud's notices and their checkpoints.
type NoticeMetrics interface {
	Notice(cloud, kind string)
	NoticeToRequest(d time.Duration)
	// NoticeCheckpoint is one notice's checkpoint: committed or not, how
	// long notice → end took, and the notice's lead (0: no deadline).
	NoticeCheckpoint(committed bool, took, lead time.Duration)
	// NoticePromise is the predicted request → committed of a notice
	// checkpoint and each cloud's budget for it (notice − margin).
	NoticePromise(need time.Duration, budgets map[string]time.Duration)
}

// CheckpointMetrics measures checkpoints: their phases, uploads, commits
// and failures, the schedule's interval, and restores.
type CheckpointMetrics interface {
	Phase(phase string, d time.Duration) // save (request → done), upload, commit (done → committed)
	Uploaded(bytes int64, d time.Duration)
	Committed(step int64, at time.Time)
	CommitFailed(reason string)
	Interval(d time.Duration)
	Restored(bytes int64, d time.Duration)
	// RestoredFrom is where that restore's bytes came from (restore.Result.From).
	RestoredFrom(from map[string]int64)
}

// RunMetrics measures the run: its errors, readiness, goodput, machine
// and trainers.
type RunMetrics interface {
	Error(component string)
	Ready(ok bool)
	// Goodput is the run's accounting after each journal write.
	Goodput(g *journal.Goodput)
	// Machine labels the agent's series by machine (cloud, type, zone).
	Machine(cloud, instanceType, zone string)
	// Trainers is, after each of the loop's turns, the trainers connected,
	// the newest step a trainer reported and the checkpoint requests left
	// unanswered past the bound the agent warns at (supervisor.UnansweredAfter).
	Trainers(connected int, step int64, unanswered int)
}

// defaults fills each part left nil with one that measures nothing.
func (m *Metrics) defaults() {
	if m.NoticeMetrics == nil {
		m.NoticeMetrics = nopMetrics{}
	}
	if m.CheckpointMetrics == nil {
		m.CheckpointMetrics = nopMetrics{}
	}
	if m.RunMetrics == nil {
		m.RunMetrics = nopMetrics{}
	}
}

type nopMetrics struct{}

func (nopMetrics) Notice(string, string)                                 {}
func (nopMetrics) NoticeToRequest(time.Duration)                         {}
func (nopMetrics) Phase(string, time.Duration)                           {}
func (nopMetrics) Uploaded(int64, time.Duration)                         {}
func (nopMetrics) Committed(int64, time.Time)                            {}
func (nopMetrics) CommitFailed(string)                                   {}
func (nopMetrics) Interval(time.Duration)                                {}
func (nopMetrics) Error(string)                                          {}
func (nopMetrics) Restored(int64, time.Duration)                         {}
func (nopMetrics) RestoredFrom(map[string]int64)                         {}
func (nopMetrics) Ready(bool)                                            {}
func (nopMetrics) Goodput(*journal.Goodput)                              {}
func (nopMetrics) Machine(string, string, string)                        {}
func (nopMetrics) NoticeCheckpoint(bool, time.Duration, time.Duration)   {}
func (nopMetrics) NoticePromise(time.Duration, map[string]time.Duration) {}
func (nopMetrics) Trainers(int, int64, int)                              {}
