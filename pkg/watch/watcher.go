package watch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// DefaultQuiet is how long a checkpoint must go without any change before
// it counts as complete. Writers go silent between files while they gather
// the next state dict (GPU to CPU copies, optimizer state from other ranks),
// which takes seconds for large models; 10s covers that with room, and
// still leaves two thirds of GCP's 30s preemption notice (and most of AWS's
// two minutes) for the upload.
const DefaultQuiet = 10 * time.Second

// DefaultWarnAfter is how long DIR may hold no checkpoint at all before
// the watcher warns (with what it did see).
const DefaultWarnAfter = 30 * time.Minute

// HFMarker is the file Hugging Face's Trainer writes last into a
// checkpoint-<step> directory.
const HFMarker = "trainer_state.json"

// Marker settings.
const (
	MarkerAuto = "auto" // HFMarker for checkpoint-<step> directories, none otherwise
	MarkerNone = "none" // the quiet period alone
)

// Config sets up a Watcher.
type Config struct {
	Dir       string
	Pattern   string        // default DefaultPattern
	StepRegex string        // default: the last integer in the name
	Marker    string        // MarkerAuto (default), MarkerNone, or a file a directory checkpoint must hold
	Quiet     time.Duration // default DefaultQuiet
	Rescan    time.Duration // fallback scan period; default Quiet/4, within [50ms, 2s]
	WarnAfter time.Duration // default DefaultWarnAfter
	Log       *zap.Logger
}

// Watcher scans DIR for checkpoints and reports each one once it is
// complete. Filesystem events only wake the scan early: the periodic scan
// alone decides completeness, so a lost or unsupported event (NFS, a full
// inotify table) delays a checkpoint by at most one rescan period.
type Watcher struct {
	cfg   Config
	namer *Namer
	log   *zap.Logger
	root  *os.Root // DIR: everything in it is read, written and deleted through this

	scanMu sync.Mutex // one Scan at a time (Run's and the agent's loop's)

	mu        sync.Mutex // the state below; never held while DIR is walked
	state     map[string]*seen
	warned    map[string]string // name → the last problem logged for it
	newest    int64             // newest step seen in DIR, complete or not (-1: none)
	matched   time.Time         // last scan that matched something, or start
	lastWarn  time.Time
	notifying map[string]bool // directories added to the fsnotify watcher
}

// seen is what the watcher knows of one matching entry.
type seen struct {
	step     int64
	kind     string
	fp       fingerprint
	since    time.Time // when fp was first seen
	reported bool      // fp was reported complete
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
	if cfg.Marker != MarkerAuto && cfg.Marker != MarkerNone && validName(cfg.Marker) != nil {
		return nil, fmt.Errorf("watch marker %q: want auto, none or a file name", cfg.Marker)
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = DefaultQuiet
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = min(max(cfg.Quiet/4, 50*time.Millisecond), 2*time.Second)
	}
	if cfg.WarnAfter <= 0 {
		cfg.WarnAfter = DefaultWarnAfter
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	n, err := NewNamer(cfg.Pattern, cfg.StepRegex)
	if err != nil {
		return nil, err
	}
	cfg.Pattern = n.Pattern
	root, err := openDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	return &Watcher{cfg: cfg, namer: n, log: cfg.Log, root: root, state: map[string]*seen{}, warned: map[string]string{},
		newest: -1, notifying: map[string]bool{}}, nil
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
// can write to.
func checkDir(dir string) error {
	if dir == "" {
		return errors.New("watch: no directory")
	}
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("watch %s: no such directory: create it (mkdir -p) or point --watch at the directory the trainer saves into", dir)
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
func (w *Watcher) Run(ctx context.Context, out chan<- *Checkpoint) {
	fsw, err := fsnotify.NewWatcher()
	var events chan fsnotify.Event
	var errs chan error
	if err != nil {
		w.log.Warn("filesystem events unavailable: scanning periodically only", zap.Error(err), zap.Duration("rescan", w.cfg.Rescan))
	} else {
		defer fsw.Close()
		if err := fsw.Add(w.cfg.Dir); err != nil {
			w.log.Warn("filesystem events unavailable: scanning periodically only", zap.Error(err), zap.Duration("rescan", w.cfg.Rescan))
		}
		events, errs = fsw.Events, fsw.Errors
	}
	w.mu.Lock()
	w.matched, w.lastWarn = time.Now(), time.Now()
	w.mu.Unlock()
	tick := time.NewTicker(w.cfg.Rescan)
	defer tick.Stop()
	for {
		for _, c := range w.Scan(time.Now()) {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
		if fsw != nil {
			w.notify(fsw)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case _, ok := <-events:
			if !ok {
				events = nil
			}
			// A burst of writes is one scan: the ticker's period is short
			// and the quiet period has to pass anyway.
			drain(events)
		case err, ok := <-errs:
			if !ok {
				errs = nil
			} else {
				w.log.Warn("filesystem events: relying on the periodic scan", zap.Error(err))
			}
		}
	}
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

func drain(events chan fsnotify.Event) {
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// notify adds the checkpoint directories seen to the fsnotify watcher, so
// that writes inside them wake the scan too.
func (w *Watcher) notify(fsw *fsnotify.Watcher) {
	w.mu.Lock()
	var add []string
	for name, s := range w.state {
		if s.kind != KindDir {
			continue
		}
		for _, e := range s.fp {
			if e.dir {
				p := filepath.Join(w.cfg.Dir, name, filepath.FromSlash(e.rel))
				if !w.notifying[p] {
					w.notifying[p] = true
					add = append(add, p)
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
	for _, p := range add {
		fsw.Add(p) // best effort: the scan does not depend on it
	}
}

// Scan looks at DIR once, as at now, and returns the checkpoints that
// became complete. Run calls it; tests call it with their own clock.
func (w *Watcher) Scan(now time.Time) []*Checkpoint {
	w.scanMu.Lock()
	defer w.scanMu.Unlock()
	ents, err := readDir(w.root, ".")
	if err != nil {
		w.problem("", "cannot read the directory: "+err.Error())
		return nil
	}
	// The walk, which takes long for a large checkpoint, happens before
	// w.mu is taken: Pending, Retry and NewestStep (the agent's loop) do
	// not wait for it.
	snaps := map[string]snap{}
	for _, e := range ents {
		if name := e.Name(); w.namer.Match(name) {
			if _, err := w.namer.Step(name, !e.IsDir()); err == nil {
				fp, err := snapshot(w.root, name)
				snaps[name] = snap{fp, err}
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
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
		if c := w.look(name, e.Type(), snaps[name], now); c != nil {
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
// it has just become complete. w.mu is held.
func (w *Watcher) look(name string, typ os.FileMode, sn snap, now time.Time) *Checkpoint {
	kind := KindFile // how to parse the name: a symlink or device is refused below
	if typ.IsDir() {
		kind = KindDir
	}
	step, err := w.namer.Step(name, kind == KindFile)
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
	if err != nil {
		s.fp, s.since, s.reported = nil, now, false
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
		s.fp, s.since, s.reported = fp, now, false
	}
	s.problem = ""
	if m := w.marker(name, s.kind); m != "" && !fp.has(m) {
		s.problem = "waiting for " + m
		return nil
	}
	if fp.files() == 0 {
		s.problem = "empty"
		return nil
	}
	if s.reported || now.Sub(s.since) < w.cfg.Quiet {
		return nil
	}
	s.reported = true
	delete(w.warned, name)
	return &Checkpoint{Name: name, Kind: s.kind, Step: step, Path: p, fp: fp, root: w.root}
}

func kindOf(fp fingerprint) string {
	if len(fp) == 1 && fp[0].rel == "." && !fp[0].dir {
		return KindFile
	}
	return KindDir
}

// marker is the file a directory checkpoint called name must hold to be
// complete ("": none).
func (w *Watcher) marker(name, kind string) string {
	if kind != KindDir {
		return ""
	}
	switch w.cfg.Marker {
	case MarkerNone:
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
