// Package config is one agent's configuration (Config, named
// supervisor.Config too), its defaults and checks, and what it alone
// decides: the trainer's environment, its welcome, a request's deadline,
// the scheduler's prior; and the agent's measurements (Metrics).
package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/fleet"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

// Config wires one agent: a run, its store, its trainer.
type Config struct {
	RunID string
	// CheckpointDir is local scratch. The agent creates and deletes only
	// inside its own area there, <dir>/spotagent-<run-id>/: requests get
	// <area>/<id>, restores go to <area>/restore. Several runs can share it.
	CheckpointDir string
	// DefaultCheckpointDir: CheckpointDir is the default cache
	// (~/.cache/spotagent/RUN-ID), which nobody chose to fill: a finished
	// run's local copies there are deleted when it ends.
	DefaultCheckpointDir bool
	Store                cloud.Store
	Source               metadata.Source // nil: no cloud notices
	Identity             metadata.Identity
	Scheduler            *schedule.Scheduler
	Server               protocol.ServerConfig

	Command []string // the trainer; empty runs without a child (sidecar)
	// Child starts Command (nil: a real process, internal/child); the
	// agent's simulation starts trainers of its own (RunHostedChild).
	Child childproc.Starter
	// OverlapRestore starts the trainer at once and restores beside it
	// (pkg/supervisor/internal/bootrestore): the trainer learns where it
	// resumes from over the socket. Ignored with Signal or Watch, whose
	// trainers read the environment or DIR: they start after the restore.
	OverlapRestore bool
	Keep           int           // checkpoints kept by retention (default 3)
	TermGrace      time.Duration // deadline of the shutdown checkpoint (default 25s)
	KillAfter      time.Duration // SIGTERM → SIGKILL for the child (default 5s)
	// SignalWindow: a SIGTERM/SIGINT within this long of the first one is
	// the same signal, not the second that stops at once (default 1s; < 0: off).
	SignalWindow time.Duration
	MaxRestarts  int // restarts of a child that failed on its own
	// RestartBackoff: the wait before the first restart, doubling for
	// each next one up to 64 times it (0: 1s).
	RestartBackoff time.Duration
	Margin         time.Duration // safety margin kept before a notice deadline (default 5s; < 0: none)
	OnRebalance    string        // "checkpoint" (default) or "none"
	// Signal, when set, is the fallback for a trainer that does not speak
	// the protocol: each checkpoint request is written to sigbridge.RequestFile and
	// the child is sent this signal; sigbridge.DoneMarker in the dir answers it.
	Signal syscall.Signal
	// EndWhenIdle ends a run without a child once a trainer has come and
	// gone and nothing is uploading (node mode).
	EndWhenIdle bool
	// UploadGate, shared by the runs of a node agent, lets their commits
	// upload a few at a time, the most urgent first (nil: no gate).
	UploadGate *commit.Gate
	// RequestTimeout bounds how long a periodic request may go unanswered
	// before it is dropped (default 10m).
	RequestTimeout time.Duration
	// ConnectWarnAfter: a trainer that has not connected this long after
	// it started (a sidecar's: after the agent's start) is warned of,
	// once, though no checkpoint is due yet (default 2m; the auto
	// interval's first may be an hour away).
	ConnectWarnAfter time.Duration
	// FenceInterval is how often the session's lease is checked for a
	// newer session (pkg/supervisor's commits.go); 0: 30s, < 0: no
	// lease, no fencing.
	// In part mode the lease is the node's own (a second copy of node K
	// fences the first), never the run's: the nodes share latest.json.
	FenceInterval time.Duration
	// Watch, when set, is zero-code mode: the checkpoint source is the
	// watched directory (pkg/supervisor/source), not the trainer's protocol.
	Watch *source.WatchConfig
	// Node, when set, makes this agent one node of a multi-node job: it
	// commits its ranks' files as the part Node (NodePart(k)) of each job
	// checkpoint and restores that part (every part with RestoreAll).
	// Its lease is the node's (pkg/supervisor's commits.go,
	// docs/distributed.md).
	Node       string
	RestoreAll bool
	// Liveness: the heartbeats of a multi-node job's agents (pkg/supervisor/internal/ranks;
	// Timeout < 0: none). The agent fills in the store, node and session.
	Liveness liveness.Config
	// PeerTier: restore from the other nodes' local tiers (pkg/supervisor/internal/localdirs).
	PeerTier localdirs.PeerTierConfig

	// Fleet, when set, is the store at the fleet's root (the parent of the
	// run's store, or --store-prefix): the agent reads the fleet summary
	// for its scheduler's prior at start and records its session in it at
	// the end (pkg/fleet). FleetDir is the run's directory under it.
	Fleet    cloud.Store
	FleetDir string

	// LocalKeep is how many committed checkpoints the local tier keeps on
	// this machine (docs/storage.md, "The local tier"); 0: none.
	// LocalMaxBytes bounds their bytes; 0: no bound.
	LocalKeep     int
	LocalMaxBytes int64

	Metrics Metrics // a part nil: none
	Log     *zap.Logger
}

// Check refuses what cannot work together. A multi-node job's parts come
// from ranks that agree on each checkpoint through the protocol: the
// signal fallback and zero-code mode have neither ranks nor agreement, and
// each node's checkpoints would stand for the whole job.
func (c *Config) Check() error {
	if c.Node == "" {
		return nil
	}
	if c.Signal != 0 {
		return errors.New("--signal cannot be used with --node-rank: a multi-node job's ranks must speak the protocol (each node's signalled checkpoint would stand for the whole job)")
	}
	if c.Watch != nil {
		return errors.New("--watch cannot be used with --node-rank: a multi-node job's ranks must speak the protocol (each node's watched checkpoint would stand for the whole job)")
	}
	return nil
}

// SetDefaults fills in what was left zero.
func (c *Config) SetDefaults() {
	if c.Keep <= 0 {
		c.Keep = 3
	}
	if c.TermGrace <= 0 {
		c.TermGrace = 25 * time.Second
	}
	if c.KillAfter <= 0 {
		c.KillAfter = 5 * time.Second
	}
	if c.SignalWindow == 0 {
		c.SignalWindow = DefaultSignalWindow
	}
	switch {
	case c.Margin == 0:
		c.Margin = schedule.DefaultMargin
	case c.Margin < 0: // none (--margin 0s)
		c.Margin = 0
	}
	if c.OnRebalance == "" {
		c.OnRebalance = "checkpoint"
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Minute
	}
	if c.ConnectWarnAfter <= 0 {
		c.ConnectWarnAfter = 2 * time.Minute
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	c.Metrics.defaults()
	if c.Scheduler == nil {
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Log: c.Log})
	}
}

// DefaultSignalWindow is Config.SignalWindow's default: two signals closer
// than this are one (docs/reliability.md).
const DefaultSignalWindow = time.Second

// OverlapsRestore reports whether this agent restores while its trainer
// starts: OverlapRestore asked for it, and the trainer can wait. The signal fallback's trainer and zero-code mode's read the
// environment and DIR, which cannot say "pending".
func (c *Config) OverlapsRestore() bool {
	return c.OverlapRestore && c.Signal == 0 && c.Watch == nil
}

// ChildEnv is the trainer's environment.
func (c *Config) ChildEnv(areaPath string, restorePending bool, resume *protocol.Resume) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPOTAGENT_SOCKET=") { // set below, or withheld
			env = append(env, kv)
		}
	}
	env = append(env,
		"SPOTAGENT_RUN_ID="+c.RunID,
		"SPOTAGENT_CHECKPOINT_DIR="+c.CheckpointDir,
		// The client checks that the socket's peer has this uid.
		"SPOTAGENT_AGENT_UID="+strconv.Itoa(os.Geteuid()),
	)
	if c.Signal == 0 {
		env = append(env, "SPOTAGENT_SOCKET="+c.Server.Path)
	} else {
		// No socket: the bridge is the trainer's one voice; a client
		// library in the child runs as if there were no agent.
		env = append(env,
			"SPOTAGENT_SIGNAL="+sigbridge.Name(c.Signal),
			"SPOTAGENT_REQUEST_FILE="+filepath.Join(areaPath, sigbridge.RequestFile),
			"SPOTAGENT_DONE_MARKER="+sigbridge.DoneMarker,
		)
	}
	if os.Getenv(localdirs.ExitFileEnv) == "" {
		// The client writes 75 here when stopped for an interruption or
		// shutdown: a launcher that hides its workers' codes (torchrun's
		// 1) still makes this agent exit 75 (pkg/supervisor's exitCodeFor).
		env = append(env, localdirs.ExitFileEnv+"="+filepath.Join(areaPath, localdirs.ExitFileName))
	}
	if restorePending {
		// The restore runs while the trainer starts (pkg/supervisor):
		// the client blocks where it first needs the files. An older
		// client waits for its welcome, which the agent holds until the
		// restore ends: give it all the time that takes.
		env = append(env, ResumeEnv+"="+protocol.RestorePending)
		if _, ok := os.LookupEnv(WelcomeTimeoutEnv); !ok {
			env = append(env, WelcomeTimeoutEnv+"="+HeldWelcomeTimeout)
		}
	}
	if r := resume; r != nil {
		env = append(env,
			"SPOTAGENT_RESUME_DIR="+r.Dir,
			"SPOTAGENT_RESUME_STEP="+strconv.FormatInt(r.Step, 10),
			"SPOTAGENT_RESUME_MANIFEST="+r.Manifest,
		)
	}
	return env
}

// The trainer's environment for an overlapped restore (ChildEnv):
// SPOTAGENT_RESUME says "pending", and an older client's connect waits
// for its welcome.
const (
	ResumeEnv         = "SPOTAGENT_RESUME"
	WelcomeTimeoutEnv = "SPOTAGENT_WELCOME_TIMEOUT"
	// HeldWelcomeTimeout bounds an older client's wait for its welcome
	// (seconds): the restore's own stall detection ends a stuck one first.
	HeldWelcomeTimeout = "86400"
)

// Welcome is the answer to hello m, in the version both sides speak.
func (c *Config) Welcome(m protocol.Message, resume *protocol.Resume) protocol.Message {
	v := min(max(m.Version, 1), protocol.ProtocolVersion)
	return protocol.Message{Type: protocol.TypeWelcome, Version: v, RunID: c.RunID, CheckpointDir: c.CheckpointDir, Resume: resume}
}

// RequestDeadline is when the trainer must have saved a checkpoint that
// must commit by deadline: room is left to upload (the previous
// checkpoint's size at the measured throughput) and for the margin; if
// that leaves too little, the time is split in two.
func (c *Config) RequestDeadline(lastBytes int64, deadline, now time.Time) time.Time {
	upload := c.Scheduler.EstimateUpload(lastBytes)
	reqDeadline := deadline.Add(-upload - c.Margin)
	if reqDeadline.Sub(now) < deadline.Sub(now)/2 {
		reqDeadline = now.Add(deadline.Sub(now) / 2)
	}
	return reqDeadline
}

// FleetPrior is the prior of this run's first interval: the fleet's
// observed rate for this machine's cloud, type and zone where the fleet
// has enough hours, else the flat --interruption-rate (pkg/fleet).
func (c *Config) FleetPrior(ctx context.Context) fleet.Prior {
	flat := c.Scheduler.PriorRate()
	id := c.Identity
	k := fleet.Key{Cloud: string(id.Cloud), InstanceType: id.InstanceType, Zone: id.Zone}
	p := fleet.PriorFor(nil, k, flat, fleet.DefaultMinHours)
	if c.Fleet != nil {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if p, err = fleet.PriorFrom(rctx, c.Fleet, k, flat, fleet.DefaultMinHours); err != nil {
			c.Log.Warn("fleet records unreadable: using the flat prior", zap.Error(err))
		}
		cancel()
	}
	c.Log.Info("interruption prior", zap.Stringer("prior", p))
	return p
}

// The agent's measurements: the Config's Metrics.

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
