package supervisor

import (
	"context"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
)

// A trainer back after a commit (docs/protocol.md, "A trainer back after
// a commit"): a trainer that says hello to a live agent (sidecar mode's
// container restarted in place, a node-mode rank's process restarted by
// torchrun, a crashed rank reconnecting) is welcomed with the newest
// committed checkpoint, never with the older one the agent's start
// restored. When this session committed a newer step than the resume it
// would hand out (or an upload is in flight: the hello waits for it first,
// as restart() does), the hello starts a restore of what the store's rules
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

// rejoinEnv is what the rejoin restore needs of the agent (set once, in
// newAgent).
type rejoinEnv struct {
	life     context.Context
	goBgFail func(func(), func(error))
	fetch    func(context.Context) (*localdirs.Fetched, error) // localdirs.Dirs.FetchRestore, the start's options
	record   func(*localdirs.Fetched) *protocol.Resume         // commits.rejoined
	hand     func(*protocol.Resume, *protocol.Conn)            // localDirs.handRestore
	admit    func(protocol.Event, *protocol.Resume)            // a held protocol 1 hello: its welcome
	errs     func()                                            // the restore error's metric
	log      *zap.Logger
}

// rejoinHello: a hello comes (before the start's restore answers it);
// when a commit newer than the resume may be due for it, the hello waits
// for the rejoin restore, which starts once no upload is in flight
// (rejoinTick): a trainer that crashed right after done must resume that
// checkpoint once it committed. connected: trainers connected now.
func (b *bootRestore) rejoinHello(last committedCheckpoint, connected, uploads int) {
	if b.restoring != nil || b.rejoin != nil || b.gone != "" || b.env.fetch == nil {
		return
	}
	if uploads == 0 && !b.rejoinStale(last, connected) {
		return
	}
	b.rejoin = &pendingRestore{waiting: map[uint64]*protocol.Conn{}} // started by rejoinTick
	b.rejoinConnected = connected
}

// rejoinStale reports whether the resume the agent would hand out is older
// than this session's newest commit, and that was not already decided for
// this group (one decision until the next commit, or no trainer connected).
func (b *bootRestore) rejoinStale(last committedCheckpoint, connected int) bool {
	if last.id == "" || (b.resume != nil && last.step <= b.resume.Step) {
		return false
	}
	return last.id != b.rejoinFor || connected == 0
}

// rejoinTick starts the rejoin restore that waits, once no upload is in
// flight; nothing newer committed after all (the upload failed): the
// hellos get the resume as it is.
func (b *bootRestore) rejoinTick(last committedCheckpoint, uploads int) {
	p := b.rejoin
	if p == nil || p.done != nil || uploads > 0 {
		return
	}
	if !b.rejoinStale(last, b.rejoinConnected) {
		b.onRejoined(restoreResult{})
		return
	}
	from := int64(-1)
	if b.resume != nil {
		from = b.resume.Step
	}
	b.env.log.Info("a trainer is back after a commit: restoring the newest committed checkpoint before it resumes",
		zap.Int64("resume_step", from), zap.Int64("committed_step", last.step), zap.String("committed_id", last.id))
	b.rejoinFor = last.id
	q := restoreBeside(b.env.life, b.env.goBgFail, b.env.fetch)
	p.cancel, p.done = q.cancel, q.done
}

// rejoinDone is the loop's source of the rejoin restore's end (nil: none
// running).
func (b *bootRestore) rejoinDone() <-chan restoreResult {
	if b.rejoin == nil {
		return nil
	}
	return b.rejoin.done
}

// onRejoined: the rejoin restore ended; the trainers waiting learn how.
func (b *bootRestore) onRejoined(res restoreResult) {
	p, env := b.rejoin, b.env
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
