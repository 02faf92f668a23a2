package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/ranks"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/session"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

// Agent runs one training run: it restores, starts the trainer, serves the
// socket, asks for checkpoints, commits them and reacts to notices. All of
// its state is owned by the loop goroutine; uploads and the journal run
// beside it and report back over channels.
//
// Every goroutine the agent starts is owned by its lifetime: life is its
// context (cancelled by end, after the loop), bg its WaitGroup (waited by
// end). acks and journals count the subset that must land after the loop
// ends (created with context.WithoutCancel): finish waits for them, bounded.
type Agent struct {
	cfg     Config
	log     *zap.Logger
	life    context.Context
	endLife context.CancelFunc
	bg      sync.WaitGroup // every goroutine the agent starts beside the loop
	dirs    localDirs

	sess    *session.Session     // this session and the run's journal (pkg/supervisor/internal/session)
	boot    bootrestore.Boot     // the restore beside the trainers (pkg/supervisor/internal/bootrestore)
	proc    *childproc.Process   // the trainer's child process (pkg/supervisor/internal/childproc)
	conns   *trainers.Conns      // the trainers and their connections (pkg/supervisor/internal/trainers)
	commits commits              // requests, uploads and commits (commits.go)
	stops   stopSequence         // notices, signals and the stop sequence (stop.go)
	fences  chan struct{}        // the lease check found a newer session (commits.go)
	ranks   ranks.Tracker        // the child's ranks, and a lost peer (pkg/supervisor/internal/ranks)
	live    ranks.Heartbeats     // heartbeats of the job's nodes (pkg/supervisor/internal/ranks)
	job     jobPolicy            // single node or one node's part of a job (job.go)
	src     source.Source        // where checkpoints come from (restore.go): the protocol, or zero-code mode
	asks    <-chan chan<- Status // a node agent's status requests for this run (pkg/supervisor/nodemode); nil: none
	silent  silence              // what is said when nothing else would be (request.go)
	done    bool                 // loop ends
}

type committedCheckpoint struct {
	id        string
	step      int64
	at        time.Time // created
	bytes     int64
	trainedAt time.Time // when, in this session, the trainer's state matched it
}

// ExitInterrupted is protocol.ExitInterrupted (75: interrupted, run me
// again): the Python client exits with it after a stop for an interruption
// or shutdown, and so does spotagent run (see exitCodeFor).
const ExitInterrupted = protocol.ExitInterrupted

// Run restores, starts the trainer and supervises it until it exits (or,
// without a child, until a shutdown completes). It returns the exit code the
// agent should exit with: the child's, or ExitInterrupted after an
// interruption or shutdown (see exitCodeFor). An error means the agent could
// not start (store or socket unusable, or the trainer command could not be
// run) and nothing was launched; the code is then 1, or 127 for a command
// not found and 126 for one not executable, as shells do.
//
// Cancelling ctx stops the agent at once, as a second SIGTERM does: the
// trainer's group gets SIGTERM (SIGKILL after KillAfter), uploads in flight
// are cancelled and not waited for, and Run returns once the trainer has
// exited and the journal records the end of the session. Run returns only
// when every goroutine it started has ended, except an acknowledgement or
// journal write still unfinished 10s after the loop ended, or at the
// stop's deadline (--term-grace, the notice's) when that is sooner: those
// are cancelled and abandoned (see finish).
func Run(ctx context.Context, cfg Config, signals <-chan os.Signal) (int, error) {
	if len(cfg.Command) > 0 {
		// A trainer that cannot start takes no lease, restores nothing
		// and writes no journal: a restart loop on a typo leaves no trace
		// in the store.
		if _, err := exec.LookPath(cfg.Command[0]); err != nil {
			err = fmt.Errorf("start trainer: %w", err)
			return child.ExitCodeFromError(err), err
		}
	}
	// Every refusal of the socket comes before the store is touched: a
	// lease taken by a start that then gives up fences the live agent's
	// run (review, item 1).
	if err := protocol.CheckStart(cfg.Server); err != nil {
		if errors.Is(err, protocol.ErrSocketInUse) {
			return 1, SocketInUse(err)
		}
		return 1, fmt.Errorf("socket: %w", err)
	}
	sctx, signals, started, stopSignals := startSignals(ctx, signals, cfg.Log)
	defer stopSignals()
	a, err := newAgent(sctx, cfg, nil)
	if sig := started(); sig != nil {
		if err == nil {
			a.abort()
		}
		return bootrestore.StartCancelled(sig)
	}
	if err != nil {
		return 1, err
	}
	cfg = a.cfg
	if cfg.Server.Log == nil {
		cfg.Server.Log = cfg.Log
	}
	srv, stopServe, err := ServeSocket(cfg.Server)
	if err != nil {
		a.abort()
		return 1, err
	}
	defer stopServe()

	notices := make(chan metadata.Notice, 16)
	if src := cfg.Source; src != nil {
		a.goBg(func() {
			if err := src.Watch(a.life, notices); err != nil && a.life.Err() == nil {
				a.log.Error("notice source ended", zap.Error(err))
			}
		})
	}
	return a.run(ctx, srv.Events(), notices, signals, func() {
		if len(cfg.Command) > 0 && cfg.Signal != 0 {
			b := &sigbridge.Bridge{Socket: cfg.Server.Path, Sig: cfg.Signal, Area: a.dirs.Area, AreaPath: a.dirs.AreaPath,
				PID: a.proc.PID, Poll: 50 * time.Millisecond, Log: a.log}
			a.goBg(func() { b.Serve(a.life) })
			// Take the bridge's hello before the child starts, so that a
			// notice or signal at once finds a trainer to ask.
			a.awaitTrainer(srv.Events(), 10*time.Second)
		}
	})
}

// run is Run once the agent is made and its trainers' events, notices
// and signals flow (RunHostedChild's too): it starts the trainer, runs the
// loop and returns the agent's exit code. bridge (nil: none) runs before
// the trainer starts.
func (a *Agent) run(ctx context.Context, events <-chan protocol.Event, notices <-chan metadata.Notice, signals <-chan os.Signal, bridge func()) (int, error) {
	cfg := a.cfg
	a.commits.pollLease(a.life, a.cfg.FenceInterval, a.fences, a.goBg, a.log) // commits.go
	a.src.Start()
	if bridge != nil {
		bridge()
	}
	if a.cfg.OverlapsRestore() {
		a.boot.StartBeside() // pkg/supervisor/internal/bootrestore: the trainer starts meanwhile
	}
	if len(cfg.Command) > 0 {
		if err := a.startChild(); err != nil {
			a.abort()
			return child.ExitCodeFromError(err), err // 127 not found, 126 not executable, as shells do
		}
	}
	a.commits.promise.AtStart(a.sess.Journal()) // pkg/supervisor/promise
	if !a.boot.Restoring() {
		cfg.Metrics.Ready(true) // else once the restore is in place (restore.go)
	}
	a.loop(ctx, events, notices, signals)
	a.live.Stop() // pkg/supervisor/internal/ranks
	cfg.Metrics.Ready(false)
	a.proc.Close() // what the trainer left in its group goes now
	if a.boot.Aborted() {
		a.abort() // the start was given up: no session to record (restore.go)
	} else {
		a.finish()
	}
	if a.commits.fenced() { // commits.go
		return exitFenced, nil
	}
	if code, err, ok := a.boot.Exit(); ok { // pkg/supervisor/internal/bootrestore
		if c := a.proc.ExitCode(); code == ExitInterrupted && a.proc.Started() && !a.proc.Running() && !a.conns.Had() && failedOnItsOwn(c) {
			// The trainer failed on its own while the start was given up
			// for a notice: its code passes through, as a stop's does
			// (stop.go exitCodeFor; TestAgentSim seed 68074 exited 75). Not
			// one that had connected: it waited on the restore, was told
			// restore_failed, and its exit is the abort's (seed 5542).
			return c, nil
		}
		return code, err
	}
	return a.proc.ExitCode(), nil
}

// failedOnItsOwn: code is a trainer's own failure, not its finish, its
// 75, nor its answer to the agent's SIGTERM or SIGKILL: 143, 137, or 1,
// torchrun's answer to SIGTERM (as a stop's deadline kill, stop.go).
func failedOnItsOwn(code int) bool {
	switch code {
	case 0, 1, ExitInterrupted, 128 + int(syscall.SIGTERM), 128 + int(syscall.SIGKILL):
		return false
	}
	return true
}

// goBg runs fn beside the loop, owned by the agent's lifetime: end waits
// for it. fn must return once a.life ends. A panic in fn fails that work,
// never the agent (nor, in node mode, every run on the machine): it is
// logged with its stack (recovered).
func (a *Agent) goBg(fn func()) { a.goBgFail(fn, nil) }

// goBgFail is goBg for work whose result the loop waits for: a panic in
// fn is handed to fail as an error, which must report it as the work's
// result.
func (a *Agent) goBgFail(fn func(), fail func(error)) {
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		defer func() {
			if err := Recovered(a.log, recover()); err != nil && fail != nil {
				fail(err)
			}
		}()
		fn()
	}()
}

// Recovered logs p, a recovered panic (nil: none), with its stack and
// returns it as an error.
func Recovered(log *zap.Logger, p any) error {
	if p == nil {
		return nil
	}
	err := fmt.Errorf("internal error (panic): %v", p)
	log.Error("background work panicked: it fails, the agent goes on", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	return err
}

// SocketInUse says how to part two agents whose run ids default alike
// (the store's last path element) and so would share one socket, and what
// a second agent on the same store would do (fence the first).
func SocketInUse(err error) error {
	return fmt.Errorf("%w: for another run give this agent its own --run-id (it names the default socket, and defaults to the store's last path element) or --socket; a second agent of the same run, on the same store, would fence the first (the newer takes the run, the older exits 76)", err)
}

// ServeSocket listens and serves the socket until the returned stop is
// called; stop returns once Serve has.
func ServeSocket(cfg protocol.ServerConfig) (*protocol.Server, func(), error) {
	srv, err := protocol.Listen(cfg)
	if errors.Is(err, protocol.ErrSocketInUse) {
		return nil, nil, SocketInUse(err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("socket: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { srv.Serve(ctx); close(served) }()
	return srv, func() { cancel(); srv.Close(); <-served }, nil
}

// newAgent prepares one run: local directories, the journal, cleanup of
// what a crash left, and the restore of the newest committed checkpoint.
func newAgent(ctx context.Context, cfg Config, dir *os.Root) (*Agent, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.SetDefaults()
	life, endLife := context.WithCancel(ctx)
	proc := childproc.New(cfg.Command, cfg.KillAfter, cfg.RestartBackoff, cfg.Child, cfg.Log)
	a := &Agent{
		cfg: cfg, log: cfg.Log, sess: session.New(localdirs.NewRequestID(), life, cfg.Log, cfg.Metrics), life: life, endLife: endLife,
		fences: make(chan struct{}, 1), job: newJobPolicy(&cfg),
		proc: proc, conns: trainers.New(cfg.Log, proc.PID), // the child leads its own group (internal/child)
	}
	a.stops = newStopSequence(&a.cfg) // stop.go
	a.ranks = ranks.NewTracker(ranks.Env{Part: a.job.crashRecords(), Store: cfg.Store, Node: cfg.Node, Session: a.sess.ID(), Started: a.sess.Started(),
		KillAfter: cfg.KillAfter, Life: life, GoBg: a.goBgFail, Log: cfg.Log, Metrics: cfg.Metrics, Sidecar: len(cfg.Command) == 0, SocketPath: cfg.Server.Path, RunDir: dir})
	a.commits = newCommits(a.sess.Started(), &commit.Committer{Store: cfg.Store, RunID: cfg.RunID, Source: session.MachineOf(cfg.Identity), Gate: cfg.UploadGate, Log: cfg.Log},
		promise.NewState(promise.Env{Identity: cfg.Identity, Source: cfg.Source, TermGrace: cfg.TermGrace, Margin: cfg.Margin, Metrics: cfg.Metrics, Log: cfg.Log}))
	a.job.committer(a.commits.committer, a.sess.ID())
	src, sr, err := a.newSource() // restore.go
	if err != nil {
		endLife()
		return nil, err
	}
	a.src = src
	if !src.Asks() {
		cfg.Scheduler.Quiet() // its interval changes are at debug: nobody acts on them
	}
	if a.dirs.Dirs, err = localdirs.Open(dir, cfg.CheckpointDir, cfg.RunID, len(cfg.Command) == 0, cfg.Log); err != nil {
		a.src.Close()
		endLife()
		return nil, err
	}
	if cfg.Watch == nil { // the watched directory is its own local copy
		a.dirs.OpenTier(cfg.LocalKeep, cfg.LocalMaxBytes, a.log)
		pc := cfg.PeerTier
		pc.Machine = session.MachineOf(cfg.Identity)
		a.dirs.OpenPeer(ctx, pc, cfg.Store, cfg.RunID, cfg.Node, a.sess.ID(), a.log)
	}
	j, err := journal.Read(ctx, cfg.Store, cfg.RunID)
	if err != nil {
		a.log.Warn("run journal unreadable: starting a new one", zap.Error(err))
		j = &journal.Journal{Format: journal.Format, RunID: cfg.RunID}
	}
	if s := j.FinishedBefore(); s != nil {
		sayFinishedBefore(s, a.log) // dirs.go
	}
	a.sess.JournalRead(cfg.Store, j)
	a.dirs.Cleanup(ctx, a.cfg.Store, a.job.cleanup(), len(a.cfg.Command) > 0, a.log)
	cfg.Metrics.Machine(string(cfg.Identity.Cloud), cfg.Identity.InstanceType, cfg.Identity.Zone)
	cfg.Scheduler.ObserveHistory(a.cfg.FleetPrior(ctx).Seed(schedule.History{
		RunTime:         time.Duration(j.Stats.RunSeconds * float64(time.Second)),
		Interruptions:   len(j.Interruptions),
		NoticeCommitted: j.Stats.NoticeCommits,
		Cost:            time.Duration(j.Stats.CostSeconds * float64(time.Second)),
		Throughput:      j.Stats.BytesPerSec,
	}))
	if err := takeLease(ctx, a.sess, &a.cfg, a.job, a.commits.committer); err != nil { // commits.go
		a.abort()
		return nil, err
	}
	a.openRestores(sr) // restore.go
	if a.cfg.OverlapsRestore() {
		return a, nil // Run restores beside the trainer's start; the session is recorded once it succeeded
	}
	if err := a.boot.RestoreNow(ctx); err != nil { // before the loop: a signal meanwhile cancels ctx (startSignals, restore.go)
		a.abort()
		return nil, err
	}
	a.sess.RecordSession(a.cfg.Identity)
	return a, nil
}

func (a *Agent) startChild() error {
	if r := a.boot.Resume(); r != nil && r.ID == a.commits.last.id {
		a.commits.resumed(time.Now())
	}
	a.dirs.Area.Remove(localdirs.ExitFileName) // what an earlier start wrote is no answer of this one
	if p := os.Getenv(localdirs.ExitFileEnv); p != "" {
		os.Remove(p) // the ranks' first answer decides (pkg/supervisor/internal/ranks): none may be left from before
	}
	a.ranks.Reset()
	return a.proc.Start(a.cfg.ChildEnv(a.dirs.AreaPath, a.boot.Restoring(), a.boot.Resume()))
}

// awaitTrainer handles socket events until a trainer has said hello, or
// for at most timeout.
func (a *Agent) awaitTrainer(events <-chan protocol.Event, timeout time.Duration) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for a.conns.Count() == 0 {
		select {
		case ev := <-events:
			a.onEvent(ev)
		case <-deadline.C:
			a.log.Warn("signal fallback: not connected after " + timeout.String())
			return
		}
	}
}

// loop is the agent's single state-owning goroutine.
func (a *Agent) loop(ctx context.Context, events <-chan protocol.Event, notices <-chan metadata.Notice, signals <-chan os.Signal) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for !a.done {
		now := time.Now()
		a.tick(now)
		if a.done {
			return
		}
		timer.Reset(time.Until(a.nextWake(now)))
		select {
		case <-ctx.Done():
			a.log.Info("agent context ended")
			a.cfg.SignalWindow = 0 // not a signal: the second call must stop at once
			a.onSignal(os.Interrupt)
			a.onSignal(os.Interrupt)
			ctx = context.Background()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			a.onEvent(ev)
		case n := <-notices:
			a.onNotice(n)
		case sig := <-signals:
			a.onSignal(sig)
		case <-a.fences:
			a.onFenced() // commits.go
		case r := <-a.commits.results:
			a.onCommitResult(r)
			a.src.Committed(source.Result{ID: r.req.id, Res: r.res, Err: r.err})
		case work := <-a.src.Ready():
			work()
		case res := <-a.ranks.LookupDone():
			a.proc.ExitAs(a.ranks.OnLookup(res)) // pkg/supervisor/internal/ranks
		case res := <-a.boot.Done():
			a.onRestoreDone(res) // restore.go
		case res := <-a.boot.RejoinDone():
			a.boot.OnRejoined(res) // pkg/supervisor/internal/bootrestore
		case res := <-a.boot.RestartDone():
			a.restarted(res) // restore.go
		case <-a.proc.Done():
			a.onChildExit()
		case reply := <-a.asks: // node.go: buffered, never waits
			reply <- a.status()
		case s := <-a.live.Silent(): // pkg/supervisor/internal/ranks
			if a.ranks.OnPeerSilent(s, a.proc.Running(), a.stops.current != nil) {
				a.proc.Stop(a.life, a.goBg)
			}
		case <-timer.C:
		}
	}
}

// onEvent routes a trainer's message to what handles it: restore.go
// (hello), request.go (done, failed), agent_pipeline.go (saved), job.go
// (join); progress, status, bye and a disconnect here.
func (a *Agent) onEvent(ev protocol.Event) {
	c, m := ev.Conn, ev.Msg
	switch m.Type {
	case protocol.TypeHello:
		a.onHello(c, m)
	case protocol.TypeProgress:
		a.commits.seeStep(m.Step)
	case protocol.TypeDone:
		a.commits.seeStep(m.Step)
		a.onDone(c, m)
	case protocol.TypeSaved:
		a.onSaved(c, m) // agent_pipeline.go
	case protocol.TypeFailed:
		a.onFailed(c, m)
	case protocol.TypeJoin:
		a.onJoin(c, m) // job.go
	case protocol.TypeStatus:
		sendStatus(a.conns, c, a.status())
	case protocol.TypeBye:
		a.commits.seeStep(m.Step)
		a.conns.Bye(c.ID()) // pkg/supervisor/internal/trainers
	case protocol.TypeDisconnected:
		a.boot.Forget(c.ID())                                                                                        // pkg/supervisor/internal/bootrestore
		a.ranks.ConnEnded(c, a.conns.SaidBye(c.ID()), a.stops.current != nil, a.proc.Running(), a.dirs.ExitFileSays) // pkg/supervisor/internal/ranks
		a.conns.Disconnected(c.ID())                                                                                 // pkg/supervisor/internal/trainers
		for _, r := range a.commits.pending {
			if r.waiting[c.ID()] {
				delete(r.waiting, c.ID())
				r.lost++
				if len(r.waiting) == 0 {
					a.settle(r)
				}
			}
		}
		if a.cfg.EndWhenIdle && a.conns.Count() == 0 {
			// A node agent's run ends with its trainers: a part still
			// waiting for a rank of this node to join (its hello came
			// after the request) is abandoned now, not held to its
			// deadline, up to 10 minutes, with nobody left to answer
			// (a fenced copy lingered so: TestAgentSim seed 68700).
			for _, r := range a.commits.pending {
				if len(r.waiting) == 0 {
					a.settle(r)
				}
			}
		}
	}
}

// nextWake is the earliest moment tick has something to do.
func (a *Agent) nextWake(now time.Time) time.Time {
	wake := now.Add(time.Minute)
	earlier := func(t time.Time) {
		if !t.IsZero() && t.Before(wake) {
			wake = t
		}
	}
	for _, r := range a.commits.pending {
		earlier(r.deadline)
	}
	if s := a.stops.current; s != nil && now.Before(s.deadline) {
		// Once: past it, tick has done what the deadline asks. A stop
		// whose deadline passed while the agent waits on (a sidecar's
		// trainers still connected after a notice) must not wake the
		// loop at once, forever: it spun (TestAgentSim seed 5).
		earlier(s.deadline)
	}
	if len(a.commits.uploads) == 0 && !a.boot.Busy() {
		// A restart waits for the uploads and the restore under way (tick),
		// whose results wake the loop: a due one must not wake it at once,
		// forever (it spun: TestAgentSim seed 408, run mode).
		earlier(a.proc.RestartAt())
	}
	earlier(a.boot.AbandonAt())
	earlier(a.src.View(now).Wake)
	if a.ranks.Pending(a.proc.Running(), a.stops.current != nil) { // pkg/supervisor/internal/ranks
		earlier(now.Add(ranks.Poll))
	}
	if a.stops.current == nil && len(a.commits.pending) == 0 && a.trainers() > 0 && asking(a.conns, a.job) {
		// Only an agent that asks (tick): in a job, a node without rank 0
		// waits for its ranks' joins, and its due schedule woke it at
		// once, forever (it spun: TestAgentSim seed 1, part mode).
		// Not before a request that could not be sent allows (notAsked):
		// due at once, it spun.
		next := a.cfg.Scheduler.Next(a.commits.lastBlock, len(a.commits.uploads) > 0, now)
		if after := a.commits.askAfter(); next.Before(after) {
			next = after
		}
		earlier(next)
	}
	if a.stops.current == nil && a.trainers() == 0 && a.src.Asks() {
		if due := a.cfg.Scheduler.Next(a.commits.lastBlock, false, now); due.After(now) {
			earlier(due) // request.go's silence: no trainer when one is due (once past, silence's own wake)
		}
	}
	earlier(a.silent.nextWake(a.commits.pending, a.unansweredAfter(), a.cfg.ConnectWarnAfter)) // request.go's silence
	if wake.Before(now) {
		wake = now
	}
	return wake
}

// tick does whatever is due at now.
func (a *Agent) tick(now time.Time) {
	a.boot.RejoinTick(a.commits.committed(), len(a.commits.uploads)) // once no upload is in flight
	for _, r := range a.commits.pending {
		if !now.Before(r.deadline) {
			a.requestExpired(r, now)
		}
	}
	if s := a.stops.current; s != nil { // stop.go
		if a.stops.tick(now, a.stopEnds()) && a.proc.Running() && !a.proc.Stopping() {
			a.log.Warn("trainer still running at the deadline: stopping it", zap.Time("deadline", s.deadline))
			a.proc.StopAtDeadline(a.life, a.goBg)
		}
		if a.stops.graceOver(now) {
			a.stops.giveUp(a.commits.uploads) // stop.go: never waited on past the grace
		}
		a.checkDone()
	}
	switch a.ranks.Tick(now, a.proc.Running(), a.stops.current != nil) { // pkg/supervisor/internal/ranks
	case ranks.EndLauncher:
		a.proc.Stop(a.life, a.goBg)
	case ranks.KillLauncher:
		a.proc.Kill("a silent neighbour's verdict: every rank exited, the launcher still running")
	}
	a.src.Tick(now)
	if a.proc.RestartDue(now) && len(a.commits.uploads) == 0 && !a.boot.Busy() { // one restore at a time: each clears the area
		a.proc.Restarting()   // the failed trainer's leftovers must not run beside the new one
		a.boot.StartRestart() // pkg/supervisor/internal/bootrestore: beside the loop; its end comes to restarted
	}
	if a.boot.AbandonDue(now) {
		a.log.Warn("the trainer did not exit after the failed restore: stopping it")
		a.proc.Stop(a.life, a.goBg)
	}
	if iv := a.cfg.Scheduler.Interval(); a.commits.intervalChanged(iv) {
		a.cfg.Metrics.Interval(iv)
	}
	if a.stops.current == nil && len(a.commits.pending) == 0 && a.trainers() > 0 && asking(a.conns, a.job) &&
		!now.Before(a.commits.askAfter()) && a.cfg.Scheduler.Due(now, a.commits.lastBlock, len(a.commits.uploads) > 0) {
		a.request(protocol.ReasonPeriodic, now.Add(a.cfg.RequestTimeout), nil)
	}
	a.checkSilence(now) // request.go's silence
	a.checkDone()
}

// checkDone ends the loop when nothing is left to wait for. With a child,
// that is when it is gone for good and the uploads are done. Without one (a
// sidecar or a run of a node agent), the agent outlives a cloud notice, to
// tell late trainers to stop and keep serving status and metrics, and ends
// when told to shut down (signal) or, in node mode, when its trainers are gone.
func (a *Agent) checkDone() {
	if !a.proc.Gone() {
		return
	}
	if a.boot.Restoring() && len(a.cfg.Command) > 0 {
		// Nobody is left to resume: the restore's end is awaited, cancelled.
		a.boot.TrainerExited()
		return
	}
	if a.boot.Aborted() && len(a.cfg.Command) > 0 {
		a.done = true
		return
	}
	if a.stops.signals > 1 {
		a.done = true
		return
	}
	if a.ranks.Looking() {
		return // the exit code waits for the crash-record lookup (pkg/supervisor/internal/ranks)
	}
	// Uploads are waited for, but never past a signal's grace (stop.go).
	if over := a.stops.graceOver(time.Now()); !over && (a.src.View(time.Now()).Busy || len(a.commits.uploads) > 0) {
		return
	}
	if len(a.cfg.Command) > 0 {
		a.done = true
		return
	}
	if a.stops.signals > 0 && (a.stops.current == nil || a.stops.current.finished) {
		a.done = true
		return
	}
	if a.cfg.EndWhenIdle && a.conns.Had() && a.conns.Count() == 0 && len(a.commits.pending) == 0 {
		a.done = true
	}
}

func (a *Agent) onChildExit() {
	exit := a.proc.Exited()
	code := exit.Code
	a.proc.ExitAs(a.stops.exitCodeFor(exit, &a.dirs, &a.ranks))
	a.log.Info("trainer exited", zap.Int("code", code), zap.Int("pid", a.proc.LastPID()), zap.Int("agent_exit_code", a.proc.ExitCode()))
	if !a.conns.Had() && a.src.Asks() && !exit.Stopping && !exit.DeadlineKill { // not one the agent stopped
		v := silentView{socket: a.cfg.Server.Path}
		a.log.Warn("the trainer exited without ever connecting: nothing of this session was checkpointed", zap.Int("code", code), zap.String("fix", v.fix()))
	}
	for id, r := range a.commits.pending {
		// An urgent request is settled by requestExpired or the
		// disconnects, except for the signal bridge: it speaks for this
		// child alone and stays connected, so nobody else will answer.
		if r.urgent() && a.cfg.Signal == 0 {
			continue
		}
		a.commits.dropped(id)
		// A trainer that died mid-save leaves half a checkpoint: never
		// committed, and not to be left on the disk either.
		a.dirs.removeDir(r, a.goBg, a.log)
		if r.urgent() {
			a.log.Warn("trainer could not save the checkpoint", zap.String("id", id), zap.String("error", "trainer exited before saving"))
			a.stops.failed(r.stop, "trainer exited before saving", time.Now(), a.stopEnds())
			continue
		}
		a.log.Warn("checkpoint abandoned: the trainer exited before answering", zap.String("id", id), zap.String("reason", r.reason))
	}
	switch {
	case a.stops.current != nil || code == 0 || a.boot.Aborted() || a.ranks.PeerLost():
		// A lost peer: restarting this node alone cannot bring the job back.
		a.proc.GiveUp()
	default:
		a.proc.RestartOrGiveUp(code, a.cfg.MaxRestarts)
	}
}

// onSignal: the first SIGTERM/SIGINT is a notice with a --term-grace
// deadline (or tightens the interruption under way); the second stops the
// trainer at once and ends the agent without waiting for uploads. Signals
// within SignalWindow of the first are the same one: GNU timeout, `kill 0`
// and some init systems signal the agent and its process group together.
func (a *Agent) onSignal(sig os.Signal) {
	now := time.Now()
	n := a.stops.signalled(now, a.cfg.SignalWindow) // stop.go
	if n == 0 {
		a.log.Info("signal within the window of the first one: the same shutdown", zap.String("signal", sig.String()),
			zap.Duration("after", now.Sub(a.stops.firstSignal).Round(time.Millisecond)), zap.Duration("window", a.cfg.SignalWindow))
		return
	}
	if n > 1 {
		a.log.Warn("second signal: stopping the trainer now", zap.String("signal", sig.String()))
		a.proc.Stop(a.life, a.goBg)
		a.checkDone()
		return
	}
	if a.abortStart("signal "+sig.String(), &bootrestore.Abort{Sig: sig}) { // restore.go
		a.checkDone()
		return
	}
	a.log.Info("signal received: taking a final checkpoint", zap.String("signal", sig.String()), zap.Duration("grace", a.cfg.TermGrace))
	a.onNotice(signalNotice(sig, a.cfg.TermGrace))
	a.checkDone()
}

// finish ends the agent's life after the loop: it cancels what runs
// beside the loop (notice source, fence, watcher, bridge, uploads), waits
// (bounded) for the acknowledgements and journal writes that must land,
// records the end of the session in the journal, waits for everything
// else it started and releases the local directories.
func (a *Agent) finish() {
	a.endLife()
	by := a.stops.exitBy(time.Now()) // stop.go: exitWait from the loop's end
	a.sess.AwaitLanding(by)
	ctx, cancel := a.sess.ExitWrite(by)
	defer cancel()
	end := time.Now().UTC()
	code, blocked := a.proc.ExitCode(), a.commits.blocked
	unprotected := a.silent.unprotectedSeconds(end) // request.go's silence
	session := a.sess.ID()
	finished, step := finishedWork(a.cfg.Command, a.proc, a.conns), a.commits.lastStep // dirs.go
	err := a.sess.Journal().Update(ctx, func(j *journal.Journal) {
		if s := j.SessionByID(session); s != nil {
			s.End = &end
			s.ExitCode = &code
			s.BlockedSeconds = &blocked
			if unprotected > 0 {
				s.UnprotectedSeconds = &unprotected
			}
			if finished {
				s.MarkFinished(step)
			}
		}
		j.Stats.RunSeconds = a.sess.RunSeconds()
	})
	if err != nil {
		a.log.Warn("could not write the run journal", zap.Error(err))
	}
	a.sess.RecordFleet(ctx, a.cfg.Fleet, a.cfg.FleetDir, a.commits.last.step, a.commits.fenced())
	a.release(finished && a.cfg.DefaultCheckpointDir)
}

// abort ends the life of an agent whose loop never ran.
func (a *Agent) abort() {
	a.endLife()
	a.sess.AwaitLanding(a.stops.exitBy(time.Now()))
	a.release(false)
}

// release waits for every goroutine the agent started beside the loop
// (a.life has ended: they are returning) and closes its local handles;
// dropCopies deletes a finished run's local copies first (dirs.go).
func (a *Agent) release(dropCopies bool) {
	for _, r := range a.commits.pending {
		if r.pipe != nil {
			r.pipe.Abort()
			a.goBg(r.pipe.Wait)
		}
	}
	a.bg.Wait()
	for _, r := range a.commits.pending {
		if r.held != nil {
			r.held.Close()
		}
	}
	for _, u := range a.commits.uploads { // cancelled, their results never read
		if u.req.held != nil {
			u.req.held.Close()
		}
	}
	a.src.Close()
	if dropCopies {
		a.dirs.dropFinishedCopies(a.log)
	}
	a.dirs.Close()
}

// trainers counts connections that said hello. The signal bridge stays
// connected while the child it speaks for is not running (exited, or
// waiting to restart): then nobody can answer a request.
func (a *Agent) trainers() int {
	if !a.src.Asks() {
		return 0 // the source does not ask (zero-code mode): the trainer saves when it decides
	}
	if a.cfg.Signal != 0 && !a.proc.Running() {
		return 0
	}
	if a.boot.Busy() || a.boot.Failed() {
		return 0 // a restore runs, or failed: not resumed, nothing worth saving (pkg/supervisor/internal/bootrestore)
	}
	return a.conns.Count()
}
