package supervisor

import (
	"context"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
)

// A trainer back after a commit (docs/protocol.md, "The welcome's
// resume"): a trainer that says hello to a live agent (sidecar mode's
// container restarted in place, a node-mode rank's process restarted by
// torchrun, a crashed rank reconnecting) is welcomed with the newest
// committed checkpoint, never with the older one the agent's start
// restored. When this session committed a newer step than the resume it
// would hand out, the hello starts a restore of what the store's rules
// choose now (restore.Into: the local tier first, so it is fast; the
// store otherwise; in a multi-node job the newest JOB checkpoint, which is
// this node's newest commit once the job manifest landed), beside the
// loop, into the agent's restore area (a fresh directory named for the
// checkpoint; FetchRestore deletes every older restore and every handed
// one). It is served as the start's overlapped restore is
// (agent_restore.go): a protocol 2 hello is welcomed at once with restore
// "pending", then restored {resume} or restore_failed {error}; a protocol
// 1 hello's welcome waits for it. Every hello that comes while it runs
// gets its result. No checkpoint is asked for meanwhile (trainers() is
// 0): the group has not resumed. A failed restore tells the waiting
// trainers restore_failed (the agent runs on: the next hello tries
// again); the older checkpoint is never handed out instead.
//
// One decision per restarted group: the ranks that come back one after
// the other must resume the same checkpoint. The result stands for later
// hellos until this session commits again (a commit needs the whole
// group: it has resumed) or until no trainer is connected (a new
// restart); only then may a hello restore again.

// rejoinDue reports whether a hello now must wait for a restore: this
// session committed a newer step than the resume it would hand out, and
// that decision was not already taken for this group (connected:
// trainers connected now).
func (b *bootRestore) rejoinDue(last committedCheckpoint, connected int) bool {
	if b.restoring != nil || b.rejoin != nil || b.gone != "" || last.id == "" {
		return false
	}
	if b.resume != nil && last.step <= b.resume.Step {
		return false
	}
	return last.id != b.rejoinFor || connected == 0
}

// startRejoin starts the restore for a trainer back after commit last.
func (b *bootRestore) startRejoin(last committedCheckpoint, life context.Context, goBgFail func(func(), func(error)),
	fetch func(context.Context) (*localdirs.Fetched, error), log *zap.Logger) {
	from := int64(-1)
	if b.resume != nil {
		from = b.resume.Step
	}
	log.Info("a trainer is back after a commit: restoring the newest committed checkpoint before it resumes",
		zap.Int64("resume_step", from), zap.Int64("committed_step", last.step), zap.String("committed_id", last.id))
	b.rejoinFor = last.id
	b.rejoin = restoreBeside(life, goBgFail, fetch)
}

// rejoinDone is the loop's source of the rejoin restore's end (nil: none
// running).
func (b *bootRestore) rejoinDone() <-chan restoreResult {
	if b.rejoin == nil {
		return nil
	}
	return b.rejoin.done
}

// rejoinEnv is what the end of a rejoin restore needs of the agent.
type rejoinEnv struct {
	record func(*localdirs.Fetched) *protocol.Resume // commits.rejoined
	hand   func(*protocol.Resume, *protocol.Conn)    // localDirs.handRestore
	admit  func(protocol.Event, *protocol.Resume)    // a held protocol 1 hello: its welcome
	errs   func()                                    // the restore error's metric
	log    *zap.Logger
}

// onRejoined: the rejoin restore ended; the trainers waiting learn how.
func (b *bootRestore) onRejoined(res restoreResult, env rejoinEnv) {
	p := b.rejoin
	b.rejoin = nil
	if res.err != nil {
		env.log.Error("restore for a trainer back after a commit failed: it is told (the older checkpoint is not handed out)", zap.Error(res.err))
		env.errs()
		b.rejoinFor = "" // the next hello tries again
		p.tellFailed(res.err.Error())
		return
	}
	if res.f != nil {
		b.resume = env.record(res.f)
	}
	for _, c := range p.waiting {
		env.hand(b.resume, c) // dirs.go
		if err := c.Post(protocol.Message{Type: protocol.TypeRestored, Resume: b.resume}); err != nil {
			env.log.Warn("restored not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		}
	}
	for _, ev := range p.held {
		env.admit(ev, b.resume)
	}
}
