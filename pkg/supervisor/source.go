package supervisor

import (
	"context"
	"time"

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
)

// newSource is the checkpoint source Config asks for: the one place that
// knows the kinds.
func (a *Agent) newSource() (checkpointSource, error) {
	if a.cfg.Watch != nil {
		return newWatchSource(a)
	}
	return protocolSource{a}, nil
}

// protocolSource: the trainer speaks the protocol (the default).
type protocolSource struct{ a *Agent }

func (p protocolSource) restore(ctx context.Context) (*protocol.Resume, error) {
	return p.a.restoreArea(ctx) // agent.go
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
func (p protocolSource) reached(time.Time) (int64, string) { return p.a.commits.lastStep, "" }
