package bootrestore

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
// as a restart does), the hello starts a restore of what the store's rules
// choose now (restore.Into: the local tier first, so it is fast; the
// store otherwise; in a multi-node job the newest JOB checkpoint, which is
// this node's newest commit once the job manifest landed), beside the
// loop, into the agent's restore area (a fresh directory named for the
// checkpoint; FetchRestore deletes every older restore and every handed
// one). It is served as the start's overlapped restore is
// (boot.go): a protocol 2 hello is welcomed at once with restore
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

// Env is what the restores need of the agent (set once, in newAgent):
// every restore fetches with Fetch (the source's, with the options built
// once; beside the loop, it touches none of the loop's state) and is
// recorded by Record (on the loop). NoRejoin: a trainer back after a
// commit resumes what it finds (zero-code mode: its own directory).
type Env struct {
	Life     context.Context
	GoBgFail func(func(), func(error))
	Fetch    func(context.Context) (*localdirs.Fetched, error) // nil, nil: no committed checkpoint
	Record   func(*localdirs.Fetched) *protocol.Resume         // the agent's one record of a restore (nil: a fresh start)
	Hand     func(*protocol.Resume, *protocol.Conn)            // localDirs.handRestore
	Admit    func(protocol.Event, *protocol.Resume)            // a held protocol 1 hello: its welcome
	Errs     func()                                            // the restore error's metric
	NoRejoin bool
	Log      *zap.Logger
}

// Committed is this session's newest committed checkpoint (id empty:
// none), as the agent's commits hold it.
type Committed struct {
	ID   string
	Step int64
}

// RejoinHello: a hello comes (before the start's restore answers it);
// when a commit newer than the resume may be due for it, the hello waits
// for the rejoin restore, which starts once no upload is in flight
// (RejoinTick): a trainer that crashed right after done must resume that
// checkpoint once it committed. connected: trainers connected now.
func (b *Boot) RejoinHello(last Committed, connected, uploads int) {
	if b.Busy() || b.gone != "" || b.env.NoRejoin {
		return
	}
	if uploads == 0 && !b.rejoinStale(last, connected) {
		return
	}
	b.rejoin = &Pending{waiting: map[uint64]*protocol.Conn{}} // started by RejoinTick
	b.rejoinConnected = connected
}

// rejoinStale reports whether the resume the agent would hand out is older
// than this session's newest commit, and that was not already decided for
// this group (one decision until the next commit, or no trainer connected).
func (b *Boot) rejoinStale(last Committed, connected int) bool {
	if last.ID == "" || (b.resume != nil && last.Step <= b.resume.Step) {
		return false
	}
	return last.ID != b.rejoinFor || connected == 0
}

// RejoinTick starts the rejoin restore that waits, once no upload is in
// flight; nothing newer committed after all (the upload failed): the
// hellos get the resume as it is.
func (b *Boot) RejoinTick(last Committed, uploads int) {
	p := b.rejoin
	if p == nil || p.done != nil || uploads > 0 {
		return
	}
	if !b.rejoinStale(last, b.rejoinConnected) {
		b.OnRejoined(Result{})
		return
	}
	from := int64(-1)
	if b.resume != nil {
		from = b.resume.Step
	}
	b.env.Log.Info("a trainer is back after a commit: restoring the newest committed checkpoint before it resumes",
		zap.Int64("resume_step", from), zap.Int64("committed_step", last.Step), zap.String("committed_id", last.ID))
	b.rejoinFor = last.ID
	q := b.beside()
	p.cancel, p.done = q.cancel, q.done
}

// RejoinDone is the loop's source of the rejoin restore's end (nil: none
// running).
func (b *Boot) RejoinDone() <-chan Result {
	if b.rejoin == nil {
		return nil
	}
	return b.rejoin.done
}

// OnRejoined: the rejoin restore ended; the trainers waiting learn how.
func (b *Boot) OnRejoined(res Result) {
	p, env := b.rejoin, b.env
	b.rejoin = nil
	if res.Err != nil {
		env.Log.Error("restore for a trainer back after a commit failed: it is told (the older checkpoint is not handed out)", zap.Error(res.Err))
		env.Errs()
		b.rejoinFor = "" // the next hello tries again
		p.tellFailed(res.Err.Error())
		return
	}
	if res.Fetched != nil {
		b.resume = env.Record(res.Fetched)
	}
	p.Restored(b.resume, env.Log, env.Hand, func(ev protocol.Event) { env.Admit(ev, b.resume) })
}
