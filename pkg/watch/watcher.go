package watch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/pathtrust"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// DefaultQuiet is how long a checkpoint must go without any change before
// it counts as complete. Writers go silent between files while they gather
// the next state dict (GPU to CPU copies, optimizer state from other ranks),
// which takes seconds for large models; 10s covers that with room, and
// still leaves two thirds of GCP's 30s preemption notice (and most of AWS's
// two minutes) for the upload.
const DefaultQuiet = 10 * time.Second

// defaultMarkerQuiet is the quiet window of a checkpoint that holds its
// completion marker (trainer_state.json, written last): the marker, not
// the window, says it is complete; the window only lets the few small
// files some versions write right after it (rng_state.pth) land. It must
// stay well under the save period of a trainer that rotates its
// checkpoints (save_total_limit=1 deletes each one as soon as the next is
// saved, which can be a second later). A checkpoint that changes after all
// is caught when its upload is verified.
const defaultMarkerQuiet = 250 * time.Millisecond

// defaultWarnAfter is how long DIR may hold no checkpoint at all before
// the watcher warns (with what it did see).
const defaultWarnAfter = 30 * time.Minute

// HFMarker is the file Hugging Face's Trainer writes last into a
// checkpoint-<step> directory.
const HFMarker = "trainer_state.json"

// HFIncomplete is the sentinel transformers' JIT checkpoint
// (enable_jit_checkpoint) keeps in a checkpoint-<step> directory while it
// saves, removed once the save returned: a directory holding it is not
// complete, whatever else it holds (trainer_state.json is written before
// the sentinel goes, and the Trainer's own resume does not check it).
const HFIncomplete = "checkpoint-is-incomplete.txt"

// Marker settings.
const (
	MarkerAuto = "auto" // HFMarker for checkpoint-<step> directories, none otherwise
	markerNone = "none" // the quiet period alone
)

// Config sets up a Watcher.
type Config struct {
	Dir       string
	Pattern   string        // default DefaultPattern
	StepRegex string        // default: the last integer in the name
	Marker    string        // MarkerAuto (default), markerNone, or a file a directory checkpoint must hold
	Quiet     time.Duration // default DefaultQuiet
	// MarkerQuiet is the quiet window once the marker is there; default
	// defaultMarkerQuiet, never more than Quiet.
	MarkerQuiet time.Duration
	Rescan      time.Duration // fallback scan period; default Quiet/4, within [50ms, 2s]
	WarnAfter   time.Duration // default defaultWarnAfter
	Log         *zap.Logger
	// UID, when set, is the trainer's uid (--watch-uid): every file of a
	// checkpoint must be its own (owner.go). nil: DIR's owner's.
	UID *int
}

// Watcher scans DIR for checkpoints and reports each one once it is
// complete. Filesystem events only wake the scan early: the periodic scan
// alone decides completeness, so a lost or unsupported event (NFS, a full
// inotify table) delays a checkpoint by at most one rescan period.
type Watcher struct {
	cfg   Config
	namer *namer
	log   *zap.Logger
	root  *os.Root // DIR: everything in it is read, written and deleted through this
	owner ownerRule

	scanMu sync.Mutex // one Scan at a time (Run's and the agent's loop's)

	mu        sync.Mutex // the state below; never held while DIR is walked
	state     map[string]*seen
	warned    map[string]string // name → the last problem logged for it
	newest    int64             // newest step seen in DIR, complete or not (-1: none)
	matched   time.Time         // last scan that matched something, or start
	lastWarn  time.Time
	notifying map[string]bool // directories added to the fsnotify watcher
	due       time.Time       // when a checkpoint seen may next become complete (zero: none)
	deadline  time.Time       // SetDeadline's; zero: none
	dirty     map[string]bool // entries of DIR events said changed since the last scan
	topDirty  bool            // DIR's own listing changed (an entry added, removed, renamed)

	ents []os.DirEntry // DIR's listing as the last scan read it; scanMu guards it
}

// fullRescan is how often Run walks every checkpoint in DIR although no
// event said anything changed: events can be lost (a full queue is
// reported and handled at once; a filesystem that drops some silently is
// not). Between full walks only what events name is walked again, so a
// DIR of 100,000 files costs next to nothing while idle.
var fullRescan = time.Minute

// eventSettle is how long Run gathers events before it scans.
const eventSettle = 200 * time.Millisecond

// seen is what the watcher knows of one matching entry.
type seen struct {
	step     int64
	kind     string
	fp       fingerprint
	since    time.Time // when fp was first seen
	reported bool      // fp was reported complete
	stable   int       // scans since since that saw fp unchanged
	problem  string    // why it cannot be complete (yet)
}

// New checks the configuration and DIR: it must be an existing, writable
// directory (a restore writes into it), not a symlink. It is the one place
// that checks DIR, and opens it: every later access goes through that
// handle, whatever the trainer does to the path. Close releases it.
func New(cfg Config) (*Watcher, error) {
	if cfg.Marker == "" {
		cfg.Marker = MarkerAuto
	}
	if cfg.Marker != MarkerAuto && cfg.Marker != markerNone && validName(cfg.Marker) != nil {
		return nil, fmt.Errorf("watch marker %q: want auto, none or a file name", cfg.Marker)
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = DefaultQuiet
	}
	if cfg.MarkerQuiet <= 0 {
		cfg.MarkerQuiet = defaultMarkerQuiet
	}
	cfg.MarkerQuiet = min(cfg.MarkerQuiet, cfg.Quiet)
	if cfg.Rescan <= 0 {
		cfg.Rescan = min(max(cfg.Quiet/4, 50*time.Millisecond), 2*time.Second)
	}
	if cfg.WarnAfter <= 0 {
		cfg.WarnAfter = defaultWarnAfter
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	n, err := NewNamer(cfg.Pattern, cfg.StepRegex)
	if err != nil {
		return nil, err
	}
	cfg.Pattern = n.Pattern
	if err := checkAncestors(cfg, cfg.Log); err != nil {
		return nil, err
	}
	root, err := openDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	owner, err := ownerOf(cfg, root, cfg.Log)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("watch %s: %w", cfg.Dir, err)
	}
	return &Watcher{cfg: cfg, namer: n, log: cfg.Log, root: root, owner: owner, state: map[string]*seen{}, warned: map[string]string{},
		newest: -1, notifying: map[string]bool{}}, nil
}

// checkAncestors refuses a DIR below a directory of a user other than
// root, the agent's and the trainer's (DIR's owner, or --watch-uid), who
// could rename DIR away and put theirs in its place: the trainer, which
// writes by the path, would save there and resume from what is planted
// there, while the agent, on its handle, commits nothing of it. One that
// others can write without the sticky bit (an emptyDir a pod's containers
// share) is warned of: the rule of a sidecar's checkpoint dir. Judged
// before DIR's missing levels are made (pathtrust.WalkExisting), so that
// none is made below another user's directory.
func checkAncestors(cfg Config, log *zap.Logger) error {
	dir := cfg.Dir
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	trainer := -1
	if cfg.UID != nil {
		trainer = *cfg.UID
	} else if fi, err := os.Lstat(abs); err == nil {
		trainer = pathtrust.Owner(fi)
	}
	trusted := func(uid int) bool { return pathtrust.Trusted(uid) || (trainer >= 0 && uid == trainer) }
	bad, err := pathtrust.WalkExisting(abs, trusted)
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	for _, u := range bad {
		if u.Writable {
			log.Warn("a directory above the watched directory is writable by others without the sticky bit: every user or container that can write it must be trusted",
				zap.String("dir", dir), zap.String("above", u.Path), zap.Int("owner_uid", u.Owner), zap.String("mode", u.Mode.String()))
			continue
		}
		return fmt.Errorf("watch %s: %v, on the way to it: another user can rename it away and put theirs in its place: refused; %s", dir, u, u.Fix())
	}
	return nil
}

// openDir checks dir and opens it, making sure what was opened is what
// was checked.
func openDir(dir string) (*os.Root, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	root, err := checkpoint.OpenLocalDir(dir)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	return root, nil
}

// Root is DIR as New opened it: the agent stages commits through it.
func (w *Watcher) Root() *os.Root { return w.root }

// Close releases DIR, once nothing uses the watcher any more.
func (w *Watcher) Close() error { return w.root.Close() }

// checkDir accepts an existing directory (not a symlink to one) the agent
// can write to. A missing one is created (parents too, mode 0755): on a
// fresh machine, the very case that resumes, the trainer has not made it
// yet. What the agent created must be a directory owned by its own user:
// a symlink or another user's directory that appears at the name
// meanwhile is refused.
func checkDir(dir string) error {
	if dir == "" {
		return errors.New("watch: no directory")
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if fi, err = createDir(dir); err != nil {
			return err
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("watch %s: %w", dir, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("watch %s: is a symlink: give the directory itself", dir)
	case !fi.IsDir():
		return fmt.Errorf("watch %s: not a directory", dir)
	}
	if err := syscall.Access(dir, 0o2|0o1); err != nil { // W_OK|X_OK
		return fmt.Errorf("watch %s: not writable by the agent (uid %d): a restore writes into it: %w", dir, os.Getuid(), err)
	}
	return nil
}

// createDir makes the missing directory dir and returns what is there
// now, which must be a directory of the agent's user.
func createDir(dir string) (os.FileInfo, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("watch %s: create: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("watch %s: create: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("watch %s: a symlink appeared while the agent created the directory: refused", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("watch %s: appeared owned by uid %d while the agent (uid %d) created it: refused", dir, st.Uid, os.Geteuid())
	}
	return fi, nil
}

// Config returns the effective configuration.
func (w *Watcher) Config() Config { return w.cfg }

// NewestStep is the highest step of any checkpoint seen in DIR, complete
// or not; -1 when none was seen.
func (w *Watcher) NewestStep() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newest
}

// Pending reports whether DIR holds a checkpoint newer than step that is
// not complete yet but may become so (it is not refused, and has what its
// marker requires or still may).
func (w *Watcher) Pending(step int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.state {
		if s.step > step && !s.reported && !strings.HasPrefix(s.problem, "refused") {
			return true
		}
	}
	return false
}

// SetDeadline shrinks the quiet window to what deadline allows (a
// termination notice's upload deadline): a checkpoint unchanged since it
// was first seen is complete at deadline at the latest (after MarkerQuiet
// at least). The zero time lifts it.
func (w *Watcher) SetDeadline(deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deadline = deadline
}

// Retry forgets that name was reported complete: once it is quiet again
// it is reported again (after a failed or torn upload).
func (w *Watcher) Retry(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.state[name]; s != nil {
		s.reported, s.since = false, time.Now()
	}
}

// Run scans DIR until ctx ends, sending each checkpoint that becomes
// complete to out (a checkpoint that changes and settles again is sent
// again). It returns when ctx is done.
//
// Filesystem events (fsnotify: inotify on Linux) drive it: an event marks
// the entry of DIR it is in, and a scan walks again only the entries
// marked, reusing what it knew of the others. Every fullRescan (and after
// an event queue overflow) it walks everything. Without events (NFS, a
// full inotify table: the watch cannot be added) every scan, every
// Rescan, walks everything, as the watcher always did.
func (w *Watcher) Run(ctx context.Context, out chan<- *Checkpoint) {
	fsw, evOK := w.watchDir()
	var events chan fsnotify.Event
	var errs chan error
	if fsw != nil {
		defer fsw.Close()
		events, errs = fsw.Events, fsw.Errors
	}
	w.mu.Lock()
	w.matched, w.lastWarn = time.Now(), time.Now()
	w.mu.Unlock()
	tick := time.NewTicker(w.cfg.Rescan)
	defer tick.Stop()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	var lastFull time.Time
	for {
		now := time.Now()
		full := !evOK || now.Sub(lastFull) >= fullRescan
		if full {
			lastFull = now
		}
		for _, c := range w.scan(now, full) {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
		if evOK && !w.notify(fsw) {
			w.log.Warn("filesystem events incomplete (a checkpoint directory could not be watched): scanning everything periodically",
				zap.Duration("rescan", w.cfg.Rescan))
			evOK = false
		}
		if evOK && w.hasDirty() {
			continue // directories just watched: walk them again now
		}
		// Wake when the next checkpoint's quiet window ends, not a rescan
		// period later.
		var due <-chan time.Time
		w.mu.Lock()
		next := w.due
		w.mu.Unlock()
		if !next.IsZero() {
			wake.Reset(max(time.Until(next), time.Millisecond))
			due = wake.C
		}
		select {
		case <-ctx.Done():
			return
		case <-due:
		case <-tick.C:
		case ev, ok := <-events:
			if !ok {
				events, evOK = nil, false
				continue
			}
			// A burst of writes is one scan: events are gathered for
			// eventSettle first. Completeness needs a quiet window
			// anyway, and walking a checkpoint being written at every
			// event would cost a core.
			w.event(ev)
			open, live := w.settle(ctx, events)
			if !live {
				return
			}
			if !open {
				events, evOK = nil, false
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
			} else {
				if errors.Is(err, fsnotify.ErrEventOverflow) {
					lastFull = time.Time{} // events were lost: walk everything
				}
				w.log.Warn("filesystem events: relying on the periodic scan", zap.Error(err))
			}
		}
	}
}

// watchDir starts filesystem events on DIR; ok false: none, DIR is
// scanned periodically only (fsw, when not nil, still needs closing).
func (w *Watcher) watchDir() (fsw *fsnotify.Watcher, ok bool) {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		fsw = nil
	} else if err = fsw.Add(w.cfg.Dir); err == nil {
		return fsw, true
	}
	w.log.Warn("filesystem events unavailable: scanning periodically only", zap.Error(err), zap.Duration("rescan", w.cfg.Rescan))
	return fsw, false
}

// settle gathers the events of a burst for eventSettle, so that a burst of
// writes is one scan. open false: events closed meanwhile; live false: ctx
// ended.
func (w *Watcher) settle(ctx context.Context, events <-chan fsnotify.Event) (open, live bool) {
	t := time.NewTimer(eventSettle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, false
		case <-t.C:
			return true, true
		case ev, ok := <-events:
			if !ok {
				return false, true
			}
			w.event(ev)
		}
	}
}

// event marks the entry of DIR that ev is about.
func (w *Watcher) event(ev fsnotify.Event) {
	rel, err := filepath.Rel(w.cfg.Dir, ev.Name)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty == nil {
		w.dirty = map[string]bool{}
	}
	first, _, nested := strings.Cut(filepath.ToSlash(rel), "/")
	if !nested {
		w.topDirty = true // an entry of DIR itself: added, removed, renamed
	}
	if first != "." {
		w.dirty[first] = true
	}
}

func (w *Watcher) hasDirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dirty) > 0 || w.topDirty
}

// readDir lists the directory rel below root, in name order; opened
// non-blocking and only if it is a directory (not a symlink to one).
func readDir(root *os.Root, rel string) ([]os.DirEntry, error) {
	d, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	return ents, err
}

// notify adds the checkpoint directories seen to the fsnotify watcher, so
// that writes inside them are events too. An entry whose directory was
// just added is marked, to be walked again: what was written in it before
// the watch was there raised no event. It returns false when a directory
// that still exists could not be watched (the inotify table is full):
// events then cannot be relied on.
func (w *Watcher) notify(fsw *fsnotify.Watcher) bool {
	w.mu.Lock()
	type dir struct{ path, entry string }
	var add []dir
	for name, s := range w.state {
		if s.kind != kindDir {
			continue
		}
		for _, e := range s.fp {
			if e.dir {
				p := filepath.Join(w.cfg.Dir, name, filepath.FromSlash(e.rel))
				if !w.notifying[p] {
					w.notifying[p] = true
					add = append(add, dir{p, name})
				}
			}
		}
	}
	for p := range w.notifying {
		if _, err := os.Lstat(p); err != nil {
			delete(w.notifying, p)
		}
	}
	w.mu.Unlock()
	ok := true
	for _, d := range add {
		if err := fsw.Add(d.path); err != nil {
			if _, lerr := os.Lstat(d.path); lerr == nil {
				ok = false
			}
			continue
		}
		w.mu.Lock()
		if w.dirty == nil {
			w.dirty = map[string]bool{}
		}
		w.dirty[d.entry] = true
		w.mu.Unlock()
	}
	return ok
}

// Scan looks at DIR once, as at now, and returns the checkpoints that
// became complete. Run calls it; tests call it with their own clock.
func (w *Watcher) Scan(now time.Time) []*Checkpoint { return w.scan(now, true) }

// scan is Scan; unless full, it walks again only the entries events
// marked (and reads DIR's listing only if an entry was added, removed or
// renamed), and takes the others as they were.
func (w *Watcher) scan(now time.Time, full bool) []*Checkpoint {
	w.scanMu.Lock()
	defer w.scanMu.Unlock()
	w.mu.Lock()
	dirty, listed := w.dirty, w.topDirty
	w.dirty, w.topDirty = nil, false
	w.mu.Unlock()
	full = full || w.ents == nil
	ents := w.ents
	if full || listed {
		var err error
		if ents, err = readDir(w.root, "."); err != nil {
			w.ents = nil
			w.problem("", "cannot read the directory: "+err.Error())
			return nil
		}
		w.ents = ents
	}
	// The walk, which takes long for a large checkpoint, happens before
	// w.mu is taken: Pending, Retry and NewestStep (the agent's loop) do
	// not wait for it.
	snaps := map[string]snap{}
	for _, e := range ents {
		name := e.Name()
		if !w.namer.Match(name) {
			continue
		}
		if _, err := w.namer.Step(name, !e.IsDir()); err != nil {
			continue
		}
		if !full && !dirty[name] {
			w.mu.Lock()
			var fp fingerprint
			if s := w.state[name]; s != nil {
				fp = s.fp
			}
			w.mu.Unlock()
			if fp != nil { // unchanged, as far as events tell
				snaps[name] = snap{fp, nil}
				continue
			}
		}
		fp, err := snapshot(w.root, name)
		snaps[name] = snap{fp, err}
	}
	// A newer checkpoint in DIR says the trainer is done with the older
	// ones: with rotation (save_total_limit) an older one may be deleted
	// long before any quiet window longer than the save period passes.
	top := int64(-1)
	for name := range snaps {
		if st, err := w.namer.Step(name, kindOf(snaps[name].fp) == kindFile); err == nil && st > top {
			top = st
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.due = time.Time{}
	var ready []*Checkpoint
	present := map[string]bool{}
	var others []string
	for _, e := range ents {
		name := e.Name()
		if !w.namer.Match(name) {
			if !strings.HasPrefix(name, reserved) {
				others = append(others, name)
			}
			continue
		}
		present[name] = true
		if c := w.look(name, e.Type(), snaps[name], top, now); c != nil {
			ready = append(ready, c)
		}
	}
	for name := range w.state {
		if !present[name] {
			delete(w.state, name)
		}
	}
	if len(present) > 0 {
		w.matched = now
	} else if now.Sub(w.matched) >= w.cfg.WarnAfter && now.Sub(w.lastWarn) >= w.cfg.WarnAfter {
		w.lastWarn = now
		sort.Strings(others)
		if len(others) > 20 {
			others = append(others[:20], fmt.Sprintf("... %d more", len(others)-20))
		}
		w.log.Warn("no checkpoint matches the watch pattern yet: check --watch and --watch-pattern, and that the trainer saves (save_steps, every_n_train_steps)",
			zap.String("dir", w.cfg.Dir), zap.String("pattern", w.cfg.Pattern), zap.Duration("for", now.Sub(w.matched).Round(time.Second)),
			zap.Strings("seen", others))
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Step < ready[j].Step })
	return ready
}

// snap is what snapshot returned for one entry.
type snap struct {
	fp  fingerprint
	err error
}

// look updates the state of one matching entry; it returns the entry when
// it has just become complete. top is the highest step in DIR. w.mu is
// held.
//
// Complete means: not empty, holding its marker if its layout has one,
// and either quiet (unchanged) for the quiet window (the short
// MarkerQuiet once the marker is there), or a newer checkpoint exists in
// DIR and this one holds its marker, or (no marker) a scan saw it
// unchanged.
func (w *Watcher) look(name string, typ os.FileMode, sn snap, top int64, now time.Time) *Checkpoint {
	kind := kindFile // how to parse the name: a symlink or device is refused below
	if typ.IsDir() {
		kind = kindDir
	}
	step, err := w.namer.Step(name, kind == kindFile)
	if err != nil {
		w.problemLocked(name, "ignored: "+err.Error())
		return nil
	}
	if step > w.newest {
		w.newest = step
	}
	p := filepath.Join(w.cfg.Dir, name)
	s := w.state[name]
	if s == nil {
		s = &seen{step: step, kind: kind}
		w.state[name] = s
	}
	fp, err := sn.fp, sn.err
	if err == nil {
		err = w.owner.check(fp, name) // owner.go
	}
	if err != nil {
		s.fp, s.since, s.reported, s.stable = nil, now, false, 0
		if errors.Is(err, errRefused) {
			s.problem = "refused: " + err.Error()
			w.problemLocked(name, s.problem)
		} else {
			s.problem = "changing" // a file vanished mid-walk: being written or deleted
		}
		return nil
	}
	s.kind = kindOf(fp)
	// Not equal: the agent's own hard links (staging) move ctimes, and
	// must not make a checkpoint look written again.
	if !fp.sameData(s.fp) {
		s.fp, s.since, s.reported, s.stable = fp, now, false, 0
	} else {
		s.stable++
	}
	s.problem = ""
	quiet := w.quietLocked()
	marked := false
	if m := w.marker(name, s.kind); m != "" {
		if !fp.has(m) {
			s.problem = "waiting for " + m
			return nil
		}
		if m == HFMarker && fp.has(HFIncomplete) {
			s.problem = "waiting for " + HFIncomplete + " to go"
			return nil
		}
		quiet, marked = min(quiet, w.cfg.MarkerQuiet), true
	}
	if !w.deadline.IsZero() {
		// Under a deadline a checkpoint unchanged since since is complete
		// by the deadline at the latest: the upload's verification still
		// catches one that was not.
		quiet = min(quiet, max(w.deadline.Sub(s.since), w.cfg.MarkerQuiet))
	}
	if fp.files() == 0 {
		s.problem = "empty"
		return nil
	}
	if s.reported {
		return nil
	}
	// A newer checkpoint in DIR: with its marker this one is done (a
	// trainer never writes into an older checkpoint once it started a
	// newer one); without a marker, once a scan saw it unchanged.
	newer := top > step && (marked || s.stable > 0)
	if now.Sub(s.since) < quiet && !newer {
		if d := s.since.Add(quiet); w.due.IsZero() || d.Before(w.due) {
			w.due = d
		}
		return nil
	}
	s.reported = true
	delete(w.warned, name)
	return &Checkpoint{Name: name, Kind: s.kind, Step: step, Path: p, fp: fp, root: w.root, owner: w.owner}
}

// quietLocked is the quiet window now. w.mu is held.
func (w *Watcher) quietLocked() time.Duration { return w.cfg.Quiet }

func kindOf(fp fingerprint) string {
	if len(fp) == 1 && fp[0].rel == "." && !fp[0].dir {
		return kindFile
	}
	return kindDir
}

// marker is the file a directory checkpoint called name must hold to be
// complete ("": none).
func (w *Watcher) marker(name, kind string) string {
	if kind != kindDir {
		return ""
	}
	switch w.cfg.Marker {
	case markerNone:
		return ""
	case MarkerAuto:
		if hfName.MatchString(name) {
			return HFMarker
		}
		return ""
	}
	return w.cfg.Marker
}

// problem logs a problem with name once (until it changes).
func (w *Watcher) problem(name, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problemLocked(name, why)
}

func (w *Watcher) problemLocked(name, why string) {
	if w.warned[name] == why {
		return
	}
	w.warned[name] = why
	w.log.Warn("watched checkpoint not usable", zap.String("dir", w.cfg.Dir), zap.String("name", name), zap.String("why", why))
}
