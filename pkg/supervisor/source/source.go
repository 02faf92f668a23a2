// Package source is where the agent's checkpoints come from: the
// interface the agent's loop drives (Source), what a source may ask of the
// agent (Host), and zero-code mode (Watch), the source that commits what
// the trainer saves into a watched directory on its own. The default
// source, the protocol's (the agent asks the trainer and restores into its
// own area), lives with the agent in pkg/supervisor, which names the kinds.
package source

import (
	"encoding/json"
	"os"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// Source is where the agent's checkpoints come from. The loop drives it
// and does not know which kind it drives:
//
//   - the protocol's, the default (pkg/supervisor): the trainer speaks the
//     protocol. The agent asks it for checkpoints and restores into its
//     own area; the source has nothing else to do.
//   - Watch (watch.go), zero-code mode: the trainer saves into a watched
//     directory on its own. The source commits each complete checkpoint
//     and decides an interruption's end; its restores (into that
//     directory: Watch.Fetch, Watch.Restored) are run by the agent's one
//     owner of restores, as the protocol's are (pkg/supervisor/internal/bootrestore).
//
// Every method runs on the loop's goroutine or before it starts (Start),
// except Close: after the loop and everything beside it ended.
type Source interface {
	// Start runs what the source needs beside the loop, owned by the
	// agent's lifetime (Env.GoBg); Close releases its handles once all of
	// that has ended, or when the loop never ran.
	Start()
	Close()
	// Ready yields work the source asks the loop to do (a checkpoint
	// found complete); nil: never.
	Ready() <-chan func()
	// Tick is the loop's pass at now; View is where the source stands
	// then (after Tick in the same pass).
	Tick(now time.Time)
	View(now time.Time) View
	// Committed follows each commit result, after the agent recorded it.
	Committed(cr Result)
	// Stop begins the interruption s, whose checkpoint must be uploaded
	// by uploadBy. false: the agent asks the trainer for it.
	Stop(s Stop, uploadBy, now time.Time) bool
	// Asks reports whether the agent asks the trainer for checkpoints.
	Asks() bool
}

// View is where a source stands at a moment, as the loop asks it.
type View struct {
	// Wake is when the source next needs a pass of the loop (zero: never).
	Wake time.Time
	// Busy keeps the agent from ending.
	Busy bool
	// Reached is the newest step the trainer reached by then as far as
	// the source knows, and ReachedFrom how that was counted
	// (Interruption.LostStepsFrom, empty: the trainer's reports): an
	// interruption loses the steps past the committed one.
	Reached     int64
	ReachedFrom string
}

var _ Source = (*Watch)(nil)

// Host is what a checkpoint source may ask of the agent, on the loop's
// goroutine (or before the loop starts): the agent keeps its state, a
// source only its own, and changes the agent's only through these calls.
type Host interface {
	// State is the agent as a source sees it now; SeeStep raises the
	// newest step the trainer reported.
	State() State
	SeeStep(step *int64)
	// Commit uploads u beside the loop (the trainer's save ended at now);
	// its result comes back through Committed. CancelUpload cancels the
	// upload of request id, if it is in flight.
	Commit(u Upload, now time.Time)
	CancelUpload(id string) bool
	// SignalTrainer signals the trainer (it may die of it: the stop it was
	// told of); StopTrainer ends it (SIGTERM, SIGKILL after KillAfter) if
	// it still runs.
	SignalTrainer(sig syscall.Signal) error
	StopTrainer()
	// StopCommitted and StopFailed end the interruption s the source took.
	// StopCommitted once s has ended: a newer checkpoint (Checkpointed
	// first) committed after it; s's record names it, nothing else changes.
	StopCommitted(s Stop, res *commit.Result, now time.Time)
	StopFailed(s Stop, why string, now time.Time)
}

// State is the agent as a source sees it: the newest committed
// checkpoint, the newest step the trainer reported, the child's state, and
// whether a stop sequence is under way.
type State struct {
	Last        Committed
	TrainerStep int64
	Trainer     Trainer
	Stopping    bool
}

// Trainer is the trainer (a child) as a source sees it.
type Trainer struct {
	Running        bool
	Gone           bool // it exited (or there never was one to wait for)
	ExitCode       int  // the agent's code from its last exit
	RestartPending bool
}

// Committed is the newest committed checkpoint as a source sees it.
type Committed struct {
	ID        string
	Step      int64
	Bytes     int64
	TrainedAt time.Time // when, in this session, the trainer's state matched it
}

// Upload is a checkpoint a source hands the agent to commit: its request
// id, why, where it lies (Dir; Rel relative to Parent, held open as Held),
// its step and metadata, and where its measured cost begins (CostFrom).
type Upload struct {
	ID, Reason, Dir string
	Rel             string
	Parent, Held    *os.Root
	Step            int64
	Metadata        json.RawMessage
	CostFrom        time.Time
}

// Result is a commit's result: of request ID, Res on success, else Err.
type Result struct {
	ID  string
	Res *commit.Result
	Err error
}

// Stop is an interruption under way, as a source sees it: why, the notice
// that began it, whether it has ended; the source tells it what it learnt
// for its journal record (Asked, Checkpointed).
type Stop interface {
	Reason() string
	Notice() metadata.Notice
	Finished() bool
	// Asked: the source asked the trainer for the stop's checkpoint at
	// at (zero-code mode's --notice-signal).
	Asked(at time.Time)
	// Checkpointed: the stop's checkpoint is id, of step; the work of
	// lostSeconds since it is lost; done is when the trainer's checkpoint
	// after the notice was complete (zero: none was).
	Checkpointed(id string, step int64, lostSeconds float64, done time.Time)
}
