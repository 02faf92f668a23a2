package supervisor

import (
	"context"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// checkpointSource is where the agent's checkpoints come from. The loop
// drives it and does not know which kind it drives:
//
//   - protocolSource, the default: the trainer speaks the protocol. The
//     agent asks it for checkpoints (agent_request.go) and restores into
//     its own area; the source has nothing else to do.
//   - watchSource (agent_watch.go), zero-code mode: the trainer saves into
//     a watched directory on its own. The source commits each complete
//     checkpoint, restores into that directory and decides an
//     interruption's end.
//
// Every method runs on the loop's goroutine or before it starts (restore,
// start), except close: after the loop and everything beside it ended.
type checkpointSource interface {
	// restore puts the newest committed checkpoint where the trainer
	// resumes from; nil when it starts fresh.
	restore(ctx context.Context) (*protocol.Resume, error)
	// start runs what the source needs beside the loop, owned by the
	// agent's lifetime (goBg); close releases its handles once all of
	// that has ended, or when the loop never ran.
	start()
	close()
	// ready yields work the source asks the loop to do (a checkpoint
	// found complete); nil: never.
	ready() <-chan func()
	// tick is the loop's pass at now; wake is when the source next needs
	// one (zero: never); busy keeps the agent from ending.
	tick(now time.Time)
	wake() time.Time
	busy(now time.Time) bool
	// committed follows each commit result, after the agent recorded it.
	committed(cr commitResult)
	// stop begins the interruption s, whose checkpoint must be uploaded
	// by uploadBy. false: the agent asks the trainer for it.
	stop(s *stopState, uploadBy, now time.Time) bool
	// asks reports whether the agent asks the trainer for checkpoints.
	asks() bool
	// reached is the newest step the trainer reached by now as far as the
	// source knows, and how that was counted (Interruption.LostStepsFrom,
	// empty: the trainer's reports): an interruption loses the steps past
	// the committed one.
	reached(now time.Time) (step int64, from string)
}

var (
	_ checkpointSource = protocolSource{}
	_ checkpointSource = (*watchSource)(nil)
	_ sourceHost       = agentHost{}
)

// sourceHost is what a checkpoint source may ask of the agent, on the
// loop's goroutine (or before the loop starts): the agent keeps its state,
// a source only its own, and changes the agent's only through these calls.
type sourceHost interface {
	// life ends with the agent; goBg runs fn beside the loop, owned by it.
	life() context.Context
	goBg(fn func())
	// last is the newest committed checkpoint; trainerStep the newest step
	// the trainer reported, seeStep raises it.
	last() committedCheckpoint
	trainerStep() int64
	seeStep(step *int64)
	// commit uploads r beside the loop (the trainer's save ended at now);
	// its result comes back through committed. cancelUpload cancels the
	// upload of request id, if it is in flight.
	commit(r *request, now time.Time)
	cancelUpload(id string) bool
	// restored records a restore (journal, metrics, the newest committed
	// checkpoint) and is the trainers' resume; epoch is the session's
	// lease epoch, the newest a restore may pick.
	restored(r *restore.Result, start time.Time, dir, manifest string) *protocol.Resume
	epoch() int64
	// trainer is the child's state now; signalTrainer signals it (it may
	// die of it: the stop it was told of); stopTrainer ends it (SIGTERM,
	// SIGKILL after KillAfter) if it still runs.
	trainer() trainerState
	signalTrainer(sig syscall.Signal) error
	stopTrainer()
	// stopping reports a stop sequence under way; stopCommitted and
	// stopFailed end the interruption s the source took.
	stopping() bool
	stopCommitted(s *stopState, res *commit.Result, now time.Time)
	stopFailed(s *stopState, why string, now time.Time)
}

// trainerState is the trainer (a child) as a source sees it.
type trainerState struct {
	started        bool // a child was started (this is a restart's restore)
	running        bool
	gone           bool // it exited (or there never was one to wait for)
	exitCode       int  // the agent's code from its last exit
	restartPending bool
}

// newSource is the checkpoint source Config asks for: the one place that
// knows the kinds.
func (a *Agent) newSource() (checkpointSource, error) {
	h := agentHost{a}
	if a.cfg.Watch == nil {
		return protocolSource{host: h, dirs: &a.dirs, store: a.cfg.Store, part: a.job.restorePart(), log: a.log}, nil
	}
	ws, err := newWatchSource(h, watchEnv{cfg: a.cfg, log: a.log, started: a.sess.started, dirs: &a.dirs})
	if err != nil {
		return nil, err
	}
	// Commits check before each manifest that the checkpoint did not
	// change during its upload.
	c := *a.commits.committer
	c.Store = ws.store
	a.commits.committer = &c
	return ws, nil
}

// protocolSource: the trainer speaks the protocol (the default).
type protocolSource struct {
	host  sourceHost
	dirs  *localDirs // the restore area
	store cloud.Store
	part  string // the part a restore fetches (jobPolicy.restorePart)
	log   *zap.Logger
}

// restore copies the newest committed checkpoint into the restore area
// and returns the resume information (nil when starting fresh).
func (p protocolSource) restore(ctx context.Context) (*protocol.Resume, error) {
	opts := restore.Options{Log: p.log, MaxEpoch: p.host.epoch(), Part: p.part}
	f, err := p.dirs.fetchRestore(ctx, p.store, opts, p.log)
	if err != nil || f == nil {
		return nil, err
	}
	return p.host.restored(f.r, f.start, f.r.Dir, f.manifest), nil
}

func (protocolSource) start()                                     {}
func (protocolSource) close()                                     {}
func (protocolSource) ready() <-chan func()                       { return nil }
func (protocolSource) tick(time.Time)                             {}
func (protocolSource) wake() time.Time                            { return time.Time{} }
func (protocolSource) busy(time.Time) bool                        { return false }
func (protocolSource) committed(commitResult)                     {}
func (protocolSource) stop(*stopState, time.Time, time.Time) bool { return false }
func (protocolSource) asks() bool                                 { return true }

// reached: what the trainer reported (progress, done, bye).
func (p protocolSource) reached(time.Time) (int64, string) { return p.host.trainerStep(), "" }

// agentHost is the agent as its checkpoint source's host.
type agentHost struct{ a *Agent }

func (h agentHost) life() context.Context     { return h.a.life }
func (h agentHost) goBg(fn func())            { h.a.goBg(fn) }
func (h agentHost) last() committedCheckpoint { return h.a.commits.last }
func (h agentHost) trainerStep() int64        { return h.a.commits.lastStep }
func (h agentHost) seeStep(step *int64)       { h.a.commits.seeStep(step) }
func (h agentHost) epoch() int64              { return h.a.commits.epoch() }
func (h agentHost) stopping() bool            { return h.a.stops.current != nil }
func (h agentHost) stopTrainer()              { h.a.proc.stopAtDeadline(h.a.life, h.a.goBg) }

func (h agentHost) commit(r *request, now time.Time) {
	h.a.commits.lastBlock = now
	h.a.commit(r)
}

func (h agentHost) cancelUpload(id string) bool {
	up := h.a.commits.uploads[id]
	if up != nil {
		up.cancel()
	}
	return up != nil
}

func (h agentHost) restored(r *restore.Result, start time.Time, dir, manifest string) *protocol.Resume {
	return h.a.commits.restored(r, start, dir, manifest, &h.a.sess, h.a.cfg.Metrics, h.a.cfg.Node)
}

func (h agentHost) trainer() trainerState {
	p := h.a.proc
	return trainerState{started: p.c != nil, running: p.running(), gone: len(h.a.cfg.Command) > 0 && !p.running(),
		exitCode: p.exitCode, restartPending: !p.restartAt.IsZero()}
}

func (h agentHost) signalTrainer(sig syscall.Signal) error {
	p := h.a.proc
	if err := p.c.Signal(sig); err != nil {
		return err
	}
	p.deadlineKill = true
	return nil
}

func (h agentHost) stopCommitted(s *stopState, res *commit.Result, now time.Time) {
	h.a.stops.committed(s, res, now)
}

func (h agentHost) stopFailed(s *stopState, why string, now time.Time) { h.a.stops.failed(s, why, now) }
