package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/watch"
)

// WatchConfig is zero-code mode (spotagent run --watch DIR): the trainer
// saves on its own into DIR; the agent commits each complete checkpoint,
// restores the newest into DIR before the trainer starts, and on a notice
// commits the newest complete one before the deadline. The agent sends no
// checkpoint requests of its own in this mode.
type WatchConfig struct {
	watch.Config
	// Prune lets the agent delete checkpoints from DIR older than the
	// newest committed one, keeping Config.Keep of them (off: it never
	// deletes the trainer's files).
	Prune bool
	// NoticeSignal, when set, is sent to the trainer's process group on a
	// termination notice, for frameworks that save when signalled.
	NoticeSignal syscall.Signal
}

// Watch is zero-code mode, the agent's checkpoint source when the
// trainer saves into a watched directory on its own (source.go); the loop
// owns it.
type Watch struct {
	host     Host
	env      Env
	cfg      WatchConfig
	w        *watch.Watcher
	store    *watch.VerifyStore
	work     chan func()             // checkpoints found complete, for the loop (ready)
	dir      *os.Root                // the watched directory (the watcher's handle)
	stage    *os.Root                // dir/watchStage: where commits are staged (hard links)
	inflight map[string]*watchUpload // request id →
	next     *watchStaged            // newest complete, staged, waiting for the upload in flight
	newest   *watch.Checkpoint       // newest complete one reported
	written  time.Time               // when the newest committed one was written (this session)
	doneAt   time.Time               // when it was found complete
	intr     *watchStop              // the interruption under way
	flushBy  time.Time               // the trainer exited: last checkpoints are awaited until then
	prune    watchPruner

	// What the trainer's checkpoints show of its progress (reached): its
	// pace, from those written since paceFrom (the agent's start, or a
	// restart's restore) with a step above resumed (the restored one's;
	// -1: none), and when it exited (zero: it runs, or there is none to
	// wait for).
	pace     watch.Pace
	paceFrom time.Time
	resumed  int64
	goneAt   time.Time
}

// Env is what zero-code mode is set up with: the agent's Config (Watch,
// whether it has a trainer command, its --signal, the store, --keep, the
// metrics), its checkpoint directory (which the watched one must not
// overlap) and the session's start (the trainer's pace is counted from it).
type Env struct {
	Watch         *WatchConfig
	HasCommand    bool
	Signal        syscall.Signal
	CheckpointDir string
	Store         cloud.Store
	Keep          int
	Metrics       interface{ Error(component string) }
	Log           *zap.Logger
	Started       time.Time
	// Life ends with the agent; GoBg runs fn beside the loop, owned by it.
	Life context.Context
	GoBg func(fn func())
}

// watchPruner runs --watch-prune beside the loop, one prune at a time: a
// prune can delete gigabytes, and meanwhile the loop must go on taking
// checkpoints and answering trainers.
type watchPruner struct {
	mu      sync.Mutex
	want    int64          // the newest committed step not pruned for yet; -1: none
	running bool           // a prune goroutine is at work
	busy    map[string]int // names staged or uploading (→ how many times): never pruned
}

// TestHookPrune, when set (tests only), runs before each prune, off the loop.
var TestHookPrune func()

// watchStaged is a checkpoint staged (hard-linked into the stage) and not
// yet handed to the committer: staged as soon as it is complete, so that
// a trainer that rotates its checkpoints (save_total_limit) cannot delete
// it while an older upload is in flight.
type watchStaged struct {
	cp   *watch.Checkpoint
	id   string
	held *os.Root      // the stage directory, as staged
	took time.Duration // the staging (hard links and their check)
}

type watchUpload struct {
	cp       *watch.Checkpoint
	unexpect func()
	started  time.Time // found complete, upload begun
}

// watchStop is an interruption in zero-code mode.
type watchStop struct {
	s        Stop
	uploadBy time.Time // past it, no newer checkpoint is awaited
	baseline int64     // the newest complete step when the notice came
	// prompt: a signal to the agent asked it to stop, so the trainer is
	// stopped at the first commit that leaves nothing behind: the newest
	// complete checkpoint at the signal, or with awaitNewer the next one
	// (the one being written then, or the save --notice-signal asks for).
	// A cloud notice fixes the machine's end instead: the trainer runs on
	// while a newer checkpoint can still be committed.
	prompt, awaitNewer bool
	// ended: when the stop's record was made (finish), of step recorded;
	// a newer checkpoint committed after it amends the record (Committed).
	ended    time.Time
	recorded int64
}

// ParseNoticeSignal accepts the signals a trainer may be sent on a notice.
func ParseNoticeSignal(s string) (syscall.Signal, error) {
	switch strings.TrimPrefix(strings.ToUpper(s), "SIG") {
	case "TERM":
		return syscall.SIGTERM, nil
	case "INT":
		return syscall.SIGINT, nil
	case "USR1":
		return syscall.SIGUSR1, nil
	case "USR2":
		return syscall.SIGUSR2, nil
	}
	return 0, fmt.Errorf("want SIGTERM, SIGINT, SIGUSR1 or SIGUSR2, got %q", s)
}

// NewWatch sets zero-code mode up, before the restore: the watched
// directory, and the committer's store, which checks before each
// manifest that the checkpoint did not change during its upload.
func NewWatch(h Host, env Env) (*Watch, error) {
	wc := env.Watch
	if env.Signal != 0 {
		return nil, errors.New("watch: --signal and --watch exclude each other")
	}
	if wc.NoticeSignal != 0 && !env.HasCommand {
		return nil, errors.New("watch: --notice-signal needs a trainer command (spotagent run)")
	}
	dir, err := filepath.Abs(wc.Dir)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	wc.Dir = dir
	scratch, _ := filepath.Abs(env.CheckpointDir)
	if nested(dir, scratch) || nested(scratch, dir) {
		return nil, fmt.Errorf("watch %s: must not contain, or be inside, the agent's --checkpoint-dir %s (the agent cleans that one up)", dir, scratch)
	}
	wc.Log = env.Log.With(zap.String("watch", dir))
	w, err := watch.New(wc.Config) // checks DIR (exists, a directory, writable) and opens it
	if err != nil {
		return nil, err
	}
	// Staged in DIR itself: hard links need one filesystem, and the
	// checkpoint directory is often on another. Through roots only.
	droot := w.Root()
	stage, err := openWatchStage(droot)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("watch: staging directory %s: %w", filepath.Join(dir, watchStage), err)
	}
	ws := &Watch{host: h, env: env, cfg: *wc, w: w, store: watch.NewVerifyStore(env.Store),
		work: make(chan func()), dir: droot, stage: stage, paceFrom: env.Started, resumed: -1,
		inflight: map[string]*watchUpload{}, prune: watchPruner{want: -1, busy: map[string]int{}}}
	cw := w.Config()
	env.Log.Info("zero-code mode: watching the trainer's checkpoints", zap.String("dir", dir), zap.String("pattern", cw.Pattern),
		zap.String("marker", cw.Marker), zap.Duration("quiet", cw.Quiet), zap.Bool("prune", wc.Prune),
		zap.String("notice_signal", sigbridge.Name(wc.NoticeSignal)))
	return ws, nil
}

// nested reports whether p is dir or inside it.
func nested(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// Fetch puts the newest committed checkpoint back into DIR under its
// original name (opts: the agent's restore options; the manifest's local
// copy goes into the agent's area). It runs beside the loop (the watcher
// is safe for that) and touches none of the source's state: Restored
// tells the source of it on the loop. nil, nil: no committed checkpoint.
func (ws *Watch) Fetch(ctx context.Context, opts restore.Options, area *os.Root, areaPath string) (*localdirs.Fetched, error) {
	start := time.Now()
	r, err := ws.w.Restore(ctx, ws.env.Store, opts)
	if errors.Is(err, restore.ErrNoCheckpoint) {
		ws.env.Log.Info("no committed checkpoint: the trainer starts fresh", zap.String("store", ws.env.Store.URI("")))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// The local manifest copy (SPOTAGENT_RESUME_MANIFEST) goes in the
	// agent's area, through its root, never through a planted symlink.
	manifest := filepath.Join(areaPath, watchManifest)
	if b, err := json.MarshalIndent(r.Manifest, "", "  "); err == nil {
		if err := checkpoint.WriteFile(area, watchManifest, b, 0o600); err != nil {
			ws.env.Log.Warn("could not write the local manifest copy", zap.Error(err))
		}
	}
	ws.env.Log.Info("restored checkpoint into the watched directory", zap.Int64("step", r.Manifest.Step), zap.String("id", r.Manifest.ID),
		zap.String("path", r.Path), zap.Int64("bytes", r.Bytes), zap.Duration("took", r.Took), zap.Int("skipped", len(r.Skipped)),
		zap.String("from", journal.Sources(r.From)), zap.Int64("local_bytes", r.From[checkpoint.FromLocal]), zap.Int64("store_bytes", r.From[checkpoint.FromStore]))
	return &localdirs.Fetched{R: r.Result, Start: start, Dir: r.Path, Manifest: manifest}, nil
}

// Restored: the trainer resumes f (nil: it starts fresh), fetched for a
// restart when restart. The trainer's pace counts afresh from a restart's
// restore, and only its checkpoints above the restored step.
func (ws *Watch) Restored(f *localdirs.Fetched, restart bool) {
	if restart {
		ws.pace.Reset()
		ws.paceFrom = time.Now()
		if f != nil {
			ws.paceFrom = f.Start
		}
	}
	ws.resumed = -1
	if f != nil {
		ws.written, ws.resumed = time.Time{}, f.R.Manifest.Step
	}
}

// Start runs the watcher beside the loop until the agent's life ends;
// what it finds complete reaches the loop through Ready.
func (ws *Watch) Start() {
	life := ws.env.Life
	found := make(chan *watch.Checkpoint, 16)
	ws.env.GoBg(func() { ws.w.Run(life, found) })
	ws.env.GoBg(func() {
		for {
			select {
			case cp := <-found:
				select {
				case ws.work <- func() { ws.onReady(cp) }:
				case <-life.Done():
					return
				}
			case <-life.Done():
				return
			}
		}
	})
}

// Close releases the watcher's handles, once it has stopped.
func (ws *Watch) Close() {
	if sc := ws.next; sc != nil {
		ws.next = nil
		sc.held.Close()
	}
	ws.stage.Close()
	// Nothing runs beside it now: what is staged is hard links to the
	// trainer's files (or an upload's leftovers), and DIR is the user's.
	if err := ws.dir.RemoveAll(watchStage); err != nil {
		ws.env.Log.Warn("could not remove the staging directory", zap.String("dir", filepath.Join(ws.cfg.Dir, watchStage)), zap.Error(err))
	}
	ws.w.Close() // ws.dir with it
}

func (ws *Watch) Ready() <-chan func() { return ws.work }

// Store is the committer's store in zero-code mode: it checks before each
// manifest that the checkpoint did not change during its upload.
func (ws *Watch) Store() *watch.VerifyStore { return ws.store }

// Asks: the trainer saves when it decides; the agent never asks it.
func (ws *Watch) Asks() bool { return false }

// onReady: cp is complete. Commit it unless something newer is
// committed; one upload at a time, the newest waiting, except during an
// interruption, when the newest goes at once and older uploads stop.
func (ws *Watch) onReady(cp *watch.Checkpoint) {
	h := ws.host
	h.SeeStep(&cp.Step)
	if ws.newest == nil || cp.Step >= ws.newest.Step {
		ws.newest = cp
	}
	// Written by this trainer: its pace. (A leftover of an earlier run
	// in DIR is older; mtimes come from the kernel's coarse clock, which
	// may lag time.Now a little.)
	if at := cp.Written(); cp.Step > ws.resumed && at.After(ws.paceFrom.Add(-time.Second)) {
		ws.pace.Add(cp.Step, at)
	}
	if last := h.State().Last; last.ID != "" && cp.Step <= last.Step {
		ws.env.Log.Debug("watched checkpoint already committed (or superseded)", zap.String("name", cp.Name), zap.Int64("step", cp.Step))
		return
	}
	for _, u := range ws.inflight {
		if u.cp.Step >= cp.Step && u.cp.Name != cp.Name {
			return // a newer one is on its way
		}
	}
	if len(ws.inflight) > 0 && ws.intr == nil {
		if ws.next == nil || cp.Step >= ws.next.cp.Step {
			if sc := ws.stageFor(cp); sc != nil {
				ws.dropNext()
				ws.next = sc
			}
		}
		return
	}
	ws.supersede(cp.Step)
	ws.commit(ws.stageFor(cp))
}

// supersede cancels the uploads in flight older than step (during an
// interruption: the newest goes at once).
func (ws *Watch) supersede(step int64) {
	for id, u := range ws.inflight {
		if u.cp.Step < step && ws.host.CancelUpload(id) {
			ws.env.Log.Info("interruption: a newer checkpoint supersedes the upload in flight", zap.String("id", id), zap.String("name", u.cp.Name))
		}
	}
}

// uploading reports whether a checkpoint of step or newer is being
// uploaded.
func (ws *Watch) uploading(step int64) bool {
	for _, u := range ws.inflight {
		if u.cp.Step >= step {
			return true
		}
	}
	return false
}

// stageFor stages cp for upload (nil: it could not be; it is retried
// once it is quiet again).
func (ws *Watch) stageFor(cp *watch.Checkpoint) *watchStaged {
	id := localdirs.NewRequestID()
	// Busy from before the staging: a prune under way must not delete it.
	ws.prune.setBusy(cp.Name, 1)
	var held *os.Root
	begun := time.Now()
	err := cp.StageIn(ws.dir, watchStage+"/"+id)
	if err == nil {
		if held, err = checkpoint.OpenDir(ws.stage, id); err != nil {
			checkpoint.RemoveDir(ws.stage, id, nil)
		}
	}
	if err != nil {
		ws.prune.setBusy(cp.Name, -1)
		ws.env.Log.Error("cannot stage a watched checkpoint for upload", zap.String("name", cp.Name), zap.Error(err))
		ws.env.Metrics.Error("checkpoint")
		ws.w.Retry(cp.Name) // once it is quiet again
		return nil
	}
	return &watchStaged{cp: cp, id: id, held: held, took: time.Since(begun)}
}

// dropNext discards the staged checkpoint waiting for the upload in
// flight (a newer one replaces it, or it is already superseded).
func (ws *Watch) dropNext() {
	sc := ws.next
	if sc == nil {
		return
	}
	ws.next = nil
	checkpoint.RemoveDir(ws.stage, sc.id, sc.held)
	sc.held.Close()
	ws.prune.setBusy(sc.cp.Name, -1)
}

// commit commits a staged checkpoint (nil: nothing to commit).
func (ws *Watch) commit(sc *watchStaged) {
	h := ws.host
	if sc == nil {
		return
	}
	if ws.next == sc {
		ws.next = nil
	} else {
		ws.dropNext()
	}
	cp, id := sc.cp, sc.id
	now := time.Now()
	reason := protocol.ReasonPeriodic
	if ws.intr != nil {
		reason = ws.intr.s.Reason()
	}
	// Its cost is what was measured (the staging, then the upload and
	// commit): the trainer's own save is not seen.
	u := Upload{ID: id, Reason: reason, Dir: filepath.Join(ws.cfg.Dir, watchStage, id), Rel: id, Parent: ws.stage, Held: sc.held,
		Step: cp.Step, Metadata: cp.Metadata(), CostFrom: now.Add(-sc.took)}
	// The staging's busy mark stays until the commit ends (committed).
	ws.inflight[id] = &watchUpload{cp: cp, unexpect: ws.store.Expect(cp.Step, id, cp.Verify), started: now}
	ws.env.Log.Info("watched checkpoint complete: committing", zap.String("id", id), zap.String("name", cp.Name),
		zap.Int64("step", cp.Step), zap.Int64("bytes", cp.Bytes()), zap.String("reason", reason))
	h.Commit(u, now)
}

// Committed follows a commit result (after onCommitResult has recorded
// it): a watched checkpoint's, or another.
func (ws *Watch) Committed(cr Result) {
	h := ws.host
	u, ok := ws.inflight[cr.ID]
	if !ok {
		return
	}
	delete(ws.inflight, cr.ID)
	ws.prune.setBusy(u.cp.Name, -1)
	u.unexpect()
	switch {
	case cr.Err == nil:
		ws.written, ws.doneAt = u.cp.Written(), u.started
		if st := ws.intr; st != nil && !st.ended.IsZero() && cr.Res.Manifest.Step > st.recorded && !u.cp.Written().After(st.ended) {
			// Complete just before the stop and seen only after its record
			// was made: the record names it, and what it saved is not lost.
			// (One written after the stop ended, by a trainer the agent
			// cannot stop, a sidecar's, is not the interruption's.)
			st.recorded = cr.Res.Manifest.Step
			st.s.Checkpointed(cr.Res.Manifest.ID, cr.Res.Manifest.Step, max(st.ended.Sub(u.cp.Written()).Seconds(), 0), u.started)
			h.StopCommitted(st.s, cr.Res, time.Now())
		}
		if ws.cfg.Prune {
			ws.pruneFrom(cr.Res.Manifest.Step)
		}
	case errors.Is(cr.Err, watch.ErrChanged):
		ws.env.Log.Warn("watched checkpoint changed during its upload: not committed, retried once it is quiet again",
			zap.String("name", u.cp.Name), zap.Error(cr.Err))
		ws.w.Retry(u.cp.Name)
	default:
		ws.w.Retry(u.cp.Name) // after another quiet period
	}
	if n := ws.next; n != nil && len(ws.inflight) == 0 {
		if h.State().Last.ID == "" || n.cp.Step > h.State().Last.Step {
			ws.commit(n)
		} else {
			ws.dropNext()
		}
	}
	ws.Tick(time.Now())
}

// pruneFrom deletes from DIR the checkpoints older than committed (the
// newest committed step), keeping --keep: off the loop, one prune at a
// time; a commit during a prune has the next one prune for it.
func (ws *Watch) pruneFrom(committed int64) {
	p := &ws.prune
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = max(p.want, committed)
	if p.running {
		return
	}
	p.running = true
	w, life := ws.w, ws.env.Life
	ws.env.GoBg(func() {
		for {
			p.mu.Lock()
			step := p.want
			p.want = -1
			if step < 0 || life.Err() != nil {
				p.running = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			if TestHookPrune != nil {
				TestHookPrune()
			}
			w.Prune(life, step, ws.env.Keep, p.isBusy)
		}
	})
}

func (p *watchPruner) setBusy(name string, d int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy[name] += d; p.busy[name] <= 0 {
		delete(p.busy, name)
	}
}

func (p *watchPruner) isBusy(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[name] > 0
}

// Stop begins an interruption in zero-code mode: signal the trainer if
// asked, then wait (until uploadBy) for a newer complete checkpoint. The
// agent sends the trainer no request.
func (ws *Watch) Stop(s Stop, uploadBy, now time.Time) bool {
	h := ws.host
	// What DIR holds now, not at the watcher's next scan: the newest
	// complete checkpoint, and whether a newer one is being written.
	for _, cp := range ws.w.Scan(now) {
		ws.onReady(cp)
	}
	// Done early only for a checkpoint newer than anything complete or
	// committed (a restored one included) when the notice came.
	st := &watchStop{s: s, uploadBy: uploadBy, baseline: -1}
	if ws.newest != nil {
		st.baseline = ws.newest.Step
	}
	if h.State().Last.ID != "" {
		st.baseline = max(st.baseline, h.State().Last.Step)
	}
	ws.intr = st
	// Completeness cannot wait past the upload deadline.
	ws.w.SetDeadline(uploadBy)
	// Safety first: the newest complete checkpoint not committed yet goes
	// at once (an older upload in flight is cancelled for it).
	if sc := ws.next; sc != nil {
		ws.supersede(sc.cp.Step)
		ws.commit(sc)
	} else if n := ws.newest; n != nil && (h.State().Last.ID == "" || n.Step > h.State().Last.Step) && !ws.uploading(n.Step) {
		ws.supersede(n.Step)
		ws.commit(ws.stageFor(n))
	}
	if s.Notice().Cloud == metadata.CloudSignal {
		st.awaitNewer = ws.w.Pending(st.baseline) || (ws.cfg.NoticeSignal != 0 && h.State().Trainer.Running)
		// With nothing complete and nothing on its way, stopping now
		// would lose every step: it runs on for a first checkpoint.
		st.prompt = st.baseline >= 0 || st.awaitNewer
	}
	if sig := ws.cfg.NoticeSignal; sig != 0 && h.State().Trainer.Running {
		// The trainer may die of it: that is the stop it was told of.
		if err := h.SignalTrainer(sig); err != nil {
			ws.env.Log.Warn("could not signal the trainer", zap.Error(err))
		} else {
			s.Asked(now)
			then := "each newer checkpoint is committed until the upload deadline, then it is stopped"
			if st.prompt {
				then = "it is stopped once that checkpoint is committed, at the upload deadline at the latest"
			}
			ws.env.Log.Info("notice: signalled the trainer to save; "+then, zap.String("signal", sigbridge.Name(sig)), zap.Time("upload_by", uploadBy))
		}
	} else {
		ws.logStop(st, now)
	}
	ws.Tick(now)
	return true
}

// logStop says, as the interruption begins, how long the trainer runs on
// and why: the agent cannot ask it for a checkpoint.
func (ws *Watch) logStop(st *watchStop, now time.Time) {
	left := zap.Float64("left_s", st.uploadBy.Sub(now).Round(time.Millisecond).Seconds())
	switch {
	case !st.prompt && st.s.Notice().Cloud == metadata.CloudSignal:
		ws.env.Log.Info("signal: no complete checkpoint yet: the trainer runs on until the upload deadline for its first one; then it is stopped",
			zap.Time("upload_by", st.uploadBy), left)
	case !st.prompt:
		ws.env.Log.Info("notice: the trainer runs on until the upload deadline, so that each newer checkpoint it saves is committed; then it is stopped",
			zap.Time("upload_by", st.uploadBy), left)
	case st.awaitNewer:
		ws.env.Log.Info("signal: the trainer is writing a checkpoint: it is stopped once that one is committed (at the upload deadline at the latest)",
			zap.Int64("newest_complete_step", st.baseline), zap.Time("upload_by", st.uploadBy), left)
	default:
		ws.env.Log.Info("signal: the trainer is stopped once the newest complete checkpoint is committed (--notice-signal would ask it to save first)",
			zap.Int64("step", st.baseline))
	}
}

// View is where the watch stands at now (source.View).
func (ws *Watch) View(now time.Time) View {
	reached, from := ws.reached(now)
	return View{Wake: ws.wake(), Busy: ws.busy(now), Reached: reached, ReachedFrom: from}
}

// wake is when the watch needs the loop next (zero: never).
func (ws *Watch) wake() time.Time {
	if st := ws.intr; st != nil && !st.s.Finished() {
		return st.uploadBy
	}
	return ws.flushBy
}

// Tick decides the interruption. The trainer keeps running while a newer
// complete checkpoint can still be committed before the upload deadline
// (uploadBy): each one is committed as it comes. At uploadBy (or once the
// trainer is gone and nothing more is being written), the newest complete
// one is committed if it is not yet, and once nothing is in flight the
// trainer is stopped: the last safe moment.
func (ws *Watch) Tick(now time.Time) {
	h := ws.host
	switch {
	case !h.State().Trainer.Gone:
		ws.goneAt = time.Time{}
	case ws.goneAt.IsZero():
		ws.goneAt = now // the first pass of the loop since it exited
	}
	if t := h.State().Trainer; t.Gone && !h.State().Stopping && ws.flushBy.IsZero() && t.ExitCode == 0 && !t.RestartPending {
		// Its last checkpoint may still be settling: wait one quiet period.
		cw := ws.w.Config()
		ws.flushBy = now.Add(cw.Quiet + 2*cw.Rescan + time.Second)
	}
	st := ws.intr
	active := st != nil && !st.s.Finished()
	late := active && (!now.Before(st.uploadBy) || st.promptDone(ws.newest))
	if (active && (h.State().Trainer.Gone || late)) || (!active && !ws.flushBy.IsZero() && now.Before(ws.flushBy)) {
		// What it wrote last, seen now rather than at the watcher's next
		// scan. The one scan of the loop's pass: busy uses its result.
		for _, cp := range ws.w.Scan(now) {
			ws.onReady(cp)
		}
	}
	if !active {
		return
	}
	committed := h.State().Last.ID != ""
	late = late || (h.State().Trainer.Gone && !ws.w.Pending(max(h.State().Last.Step, st.baseline)))
	if !late || len(ws.inflight) > 0 {
		return
	}
	if n := ws.newest; n != nil && (!committed || n.Step > h.State().Last.Step) {
		// Failed or not started: once more, before the deadline.
		if sc := ws.next; sc != nil && sc.cp.Step >= n.Step {
			ws.commit(sc)
		} else {
			ws.commit(ws.stageFor(n))
		}
		if len(ws.inflight) > 0 {
			return
		}
	}
	ws.finish(st, now)
}

// promptDone: a prompt stop has what it waits for complete (newest is the
// newest complete checkpoint): its commit is the last.
func (st *watchStop) promptDone(newest *watch.Checkpoint) bool {
	return st.prompt && (!st.awaitNewer || (newest != nil && newest.Step > st.baseline))
}

// finish ends the interruption with the newest committed checkpoint, and
// stops the trainer, which knows nothing of the agent.
func (ws *Watch) finish(st *watchStop, now time.Time) {
	h, s := ws.host, st.s
	newest := ws.w.NewestStep()
	h.SeeStep(&newest)
	if h.State().Last.ID == "" {
		h.StopFailed(s, "no complete checkpoint in the watched directory", now)
	} else {
		base := ws.written
		if base.IsZero() {
			base = h.State().Last.TrainedAt
		}
		if base.IsZero() {
			base = ws.env.Started
		}
		var done time.Time // the trainer's checkpoint after the notice was complete (zero: none)
		if h.State().Last.Step > st.baseline {
			done = ws.doneAt
		}
		s.Checkpointed(h.State().Last.ID, h.State().Last.Step, max(now.Sub(base).Seconds(), 0), done)
		st.ended, st.recorded = now, h.State().Last.Step
		res := &commit.Result{Manifest: &checkpoint.Manifest{ID: h.State().Last.ID, Step: h.State().Last.Step}, Bytes: h.State().Last.Bytes}
		h.StopCommitted(s, res, now)
	}
	if h.State().Trainer.Running && h.State().Last.ID != "" {
		why := "the upload deadline"
		if st.prompt && now.Before(st.uploadBy) {
			why = "the signal's checkpoint is committed"
		}
		ws.env.Log.Info("zero-code stop: stopping the trainer", zap.String("why", why), zap.Int64("committed_step", h.State().Last.Step))
	}
	h.StopTrainer()
}

// reached is the step the trainer reached by now (by its exit, if it
// exited): what it reported itself if that is newer than anything in DIR
// (a trainer that speaks the protocol's progress), else its pace
// extrapolated from its newest checkpoint, else the newest step in DIR
// (complete or not), which is only a lower bound: a trainer that saves
// every 10 s and is stopped 9 s after its last save lost 9 s of steps
// that DIR never shows.
func (ws *Watch) reached(now time.Time) (int64, string) {
	h := ws.host
	seen := ws.w.NewestStep() // -1: none
	if h.State().TrainerStep > max(seen, 0) {
		return h.State().TrainerStep, ""
	}
	stopped := now
	if !ws.goneAt.IsZero() && ws.goneAt.Before(now) {
		stopped = ws.goneAt
	}
	if step, ok := ws.pace.At(stopped); ok {
		return max(step, seen), journal.LostFromEstimate
	}
	return max(seen, h.State().TrainerStep), journal.LostFromDir
}

// busy keeps the agent from ending while an interruption waits for the
// trainer's checkpoint, or a trainer that exited may have left one. It
// reads what tick (run before it in each pass of the loop) saw.
func (ws *Watch) busy(now time.Time) bool {
	h := ws.host
	if st := ws.intr; st != nil && !st.s.Finished() {
		return true
	}
	if ws.flushBy.IsZero() || !now.Before(ws.flushBy) {
		return false
	}
	// No scan here: tick, earlier in the same pass of the loop, did.
	return len(ws.inflight) > 0 || ws.w.Pending(h.State().Last.Step)
}

// watchStage is the directory in DIR where watched checkpoints are staged
// for upload; hidden, so no framework takes it for a checkpoint.
const watchStage = ".spotagent-stage"

// watchManifest is the local copy of the restored checkpoint's manifest,
// in the agent's area.
const watchManifest = "watch.manifest.json"

// openWatchStage creates (or opens) DIR/watchStage, refusing a symlink,
// and empties it: what a crashed agent staged is of no further use.
func openWatchStage(dir *os.Root) (*os.Root, error) {
	if err := dir.Mkdir(watchStage, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	stage, err := checkpoint.OpenDir(dir, watchStage)
	if err != nil {
		return nil, err
	}
	d, err := stage.Open(".")
	if err == nil {
		names, _ := d.Readdirnames(-1)
		d.Close()
		for _, n := range names {
			stage.RemoveAll(n)
		}
	}
	return stage, nil
}
