package watch

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

func newWatcher(t *testing.T, cfg Config) (*Watcher, *observer.ObservedLogs) {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Quiet == 0 {
		cfg.Quiet = 10 * time.Second
	}
	core, logs := observer.New(zap.InfoLevel)
	cfg.Log = zap.New(core)
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, logs
}

func names(cs []*Checkpoint) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.Name)
	}
	return strings.Join(s, ",")
}

func TestStep(t *testing.T) {
	n, err := NewNamer("", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		isFile bool
		want   int64
	}{
		{"checkpoint-500", false, 500},
		{"epoch=3-step=1200.ckpt", true, 1200},
		{"model_v2_00300.pt", true, 300},
		{"ckpt-7.h5", true, 7}, // the extension's digits do not count
	} {
		if got, err := n.Step(tc.name, tc.isFile); err != nil || got != tc.want {
			t.Errorf("Step(%q)=%d, %v, want %d", tc.name, got, err, tc.want)
		}
	}
	if _, err := n.Step("last.ckpt", true); !errors.Is(err, ErrNoStep) {
		t.Fatalf("Step(last.ckpt) err=%v, want ErrNoStep", err)
	}
	re, err := NewNamer("*.pt", `step(\d+)`)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := re.Step("run3-step40-loss2.pt", true); err != nil || got != 40 {
		t.Fatalf("regex step=%d, %v, want 40", got, err)
	}
	if _, err := NewNamer("a/b", ""); err == nil {
		t.Fatal("a pattern with '/' accepted")
	}
	if _, err := NewNamer("[", ""); err == nil {
		t.Fatal("a bad glob accepted")
	}
	if _, err := NewNamer("", `(\d+)-(\d+)`); err == nil {
		t.Fatal("a regex with two groups accepted")
	}
}

func TestCheckDir(t *testing.T) {
	dir := t.TempDir()
	// A missing one is created, parents too, owned by the agent's user.
	fresh := filepath.Join(dir, "new", "out")
	if err := checkDir(fresh); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
	if fi, err := os.Lstat(fresh); err != nil || !fi.IsDir() {
		t.Fatalf("missing dir not created: %v", err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink(t.TempDir(), link)
	if err := checkDir(link); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("symlink: %v", err)
	}
	testutil.WriteFile(t, filepath.Join(dir, "f"), "x")
	if err := checkDir(filepath.Join(dir, "f")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("file: %v", err)
	}
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o500)
	if os.Getuid() != 0 {
		if err := checkDir(ro); err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Fatalf("read-only dir: %v", err)
		}
	}
}

// TestScan_HFLayout: a checkpoint-<N> directory is complete only with
// trainer_state.json and after the (short, marker) quiet period; a write
// resets it.
func TestScan_HFLayout(t *testing.T) {
	w, _ := newWatcher(t, Config{})
	d := filepath.Join(w.cfg.Dir, "checkpoint-100")
	testutil.WriteFile(t, filepath.Join(d, "pytorch_model.bin"), "weights")
	t0 := time.Now()
	if got := w.Scan(t0); len(got) != 0 {
		t.Fatalf("reported at first sight: %s", names(got))
	}
	if got := w.Scan(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("reported without trainer_state.json: %s", names(got))
	}
	if !w.Pending(0) {
		t.Fatal("a checkpoint waiting for its marker is not pending")
	}
	testutil.WriteFile(t, filepath.Join(d, HFMarker), "{}")
	t1 := time.Now()
	w.Scan(t1)
	// With its marker, the short window: the marker says complete.
	if got := w.Scan(t1.Add(defaultMarkerQuiet / 2)); len(got) != 0 {
		t.Fatalf("reported before the marker's quiet window: %s", names(got))
	}
	testutil.WriteFile(t, filepath.Join(d, "rng_state.pth"), "rng") // a late file
	w.Scan(t1.Add(defaultMarkerQuiet / 2))
	if got := w.Scan(t1.Add(defaultMarkerQuiet)); len(got) != 0 {
		t.Fatalf("reported too soon after a write: %s", names(got))
	}
	got := w.Scan(t1.Add(2 * defaultMarkerQuiet))
	if len(got) != 1 || got[0].Step != 100 || got[0].Kind != kindDir {
		t.Fatalf("got %+v, want checkpoint-100 complete", got)
	}
	if again := w.Scan(t1.Add(time.Hour)); len(again) != 0 {
		t.Fatalf("reported twice: %s", names(again))
	}
	if err := got[0].Verify(); err != nil {
		t.Fatal(err)
	}
	if w.NewestStep() != 100 {
		t.Fatalf("newest=%d", w.NewestStep())
	}
}

// TestScan_HFIncompleteSentinel: a checkpoint-<step> directory holding
// transformers' JIT sentinel (checkpoint-is-incomplete.txt) is not
// complete although trainer_state.json is there, not even under a deadline;
// it is once the sentinel is removed.
func TestScan_HFIncompleteSentinel(t *testing.T) {
	w, _ := newWatcher(t, Config{})
	d := filepath.Join(w.cfg.Dir, "checkpoint-30")
	testutil.WriteFile(t, filepath.Join(d, HFIncomplete), "Checkpoint started at step 30 and in progress...")
	testutil.WriteFile(t, filepath.Join(d, "model.safetensors"), "weights")
	testutil.WriteFile(t, filepath.Join(d, HFMarker), "{}")
	t0 := time.Now()
	w.SetDeadline(t0)
	w.Scan(t0)
	if got := w.Scan(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("reported with the incomplete sentinel: %s", names(got))
	}
	if err := os.Remove(filepath.Join(d, HFIncomplete)); err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(2 * time.Hour)
	w.Scan(t1)
	if got := w.Scan(t1.Add(2 * defaultMarkerQuiet)); len(got) != 1 || got[0].Step != 30 {
		t.Fatalf("got %+v, want checkpoint-30 complete once the sentinel is gone", got)
	}
}

// TestScan_Files: a pattern for files; a name without a step is ignored
// with a warning; a symlink is refused, wherever it leads.
func TestScan_Files(t *testing.T) {
	w, logs := newWatcher(t, Config{Pattern: "*.ckpt"})
	dir := w.cfg.Dir
	testutil.WriteFile(t, filepath.Join(dir, "epoch=0-step=50.ckpt"), "a")
	testutil.WriteFile(t, filepath.Join(dir, "last.ckpt"), "b")
	outside := filepath.Join(t.TempDir(), "secret")
	testutil.WriteFile(t, outside, "secret")
	os.Symlink(outside, filepath.Join(dir, "step=90.ckpt"))
	testutil.WriteFile(t, filepath.Join(dir, "notes.txt"), "c")
	t0 := time.Now()
	w.Scan(t0)
	got := w.Scan(t0.Add(time.Minute))
	if names(got) != "epoch=0-step=50.ckpt" || got[0].Kind != kindFile || got[0].Step != 50 {
		t.Fatalf("got %s, want only epoch=0-step=50.ckpt", names(got))
	}
	if n := logs.FilterMessage("watched checkpoint not usable").FilterFieldKey("why").Len(); n != 2 {
		t.Fatalf("%d warnings, want 2 (no step, symlink): %v", n, logs.All())
	}
	var why []string
	for _, e := range logs.All() {
		why = append(why, e.ContextMap()["why"].(string))
	}
	if j := strings.Join(why, "|"); !strings.Contains(j, "no step in the name") || !strings.Contains(j, "symlink to "+outside) {
		t.Fatalf("warnings %q", j)
	}
	w.Scan(t0.Add(2 * time.Minute))
	if n := logs.Len(); n != 2 {
		t.Fatalf("warnings repeated: %d", n)
	}
}

// TestScan_SymlinkInside: a directory checkpoint holding a symlink is
// refused as a whole.
func TestScan_SymlinkInside(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone})
	d := filepath.Join(w.cfg.Dir, "checkpoint-5")
	testutil.WriteFile(t, filepath.Join(d, "a.bin"), "a")
	os.Symlink("/etc/passwd", filepath.Join(d, "b.bin"))
	t0 := time.Now()
	w.Scan(t0)
	if got := w.Scan(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("a checkpoint holding a symlink was reported: %s", names(got))
	}
	if w.Pending(0) {
		t.Fatal("a refused checkpoint counts as pending")
	}
}

// TestScan_WarnsWhenNothingMatches: the warning lists what was seen.
func TestScan_WarnsWhenNothingMatches(t *testing.T) {
	w, logs := newWatcher(t, Config{WarnAfter: time.Minute})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "ckpt_100"), "x")
	t0 := time.Now()
	w.matched, w.lastWarn = t0, t0
	w.Scan(t0.Add(30 * time.Second))
	if logs.Len() != 0 {
		t.Fatalf("warned early: %v", logs.All())
	}
	w.Scan(t0.Add(2 * time.Minute))
	e := logs.FilterMessageSnippet("no checkpoint matches").All()
	if len(e) != 1 || !strings.Contains(e[0].ContextMap()["seen"].([]any)[0].(string), "ckpt_100") {
		t.Fatalf("want one warning naming ckpt_100, got %v", logs.All())
	}
}

// TestVerify_Changed: a checkpoint written after it was found complete
// fails Verify; so does one with a file added, and one replaced by rename.
// A file removed is not a change: the staged link holds it (rotation).
func TestVerify_Changed(t *testing.T) {
	for _, change := range []string{"append", "add", "replace", "rewrite-keeping-mtime"} {
		t.Run(change, func(t *testing.T) {
			w, _ := newWatcher(t, Config{Marker: markerNone})
			d := filepath.Join(w.cfg.Dir, "checkpoint-1")
			testutil.WriteFile(t, filepath.Join(d, "a.bin"), "aaaa")
			testutil.WriteFile(t, filepath.Join(d, "sub", "c.bin"), "cccc")
			t0 := time.Now()
			w.Scan(t0)
			got := w.Scan(t0.Add(time.Hour))
			if len(got) != 1 {
				t.Fatal("not complete")
			}
			stageIn(t, got[0], "s1") // as the agent does: the links move ctimes
			if err := got[0].Verify(); err != nil {
				t.Fatalf("Verify of an unchanged, staged checkpoint: %v", err)
			}
			switch change {
			case "append":
				f, _ := os.OpenFile(filepath.Join(d, "a.bin"), os.O_APPEND|os.O_WRONLY, 0)
				f.WriteString("more")
				f.Close()
			case "add":
				testutil.WriteFile(t, filepath.Join(d, "b.bin"), "b")
			case "replace":
				testutil.WriteFile(t, filepath.Join(d, "tmp"), "aaaa")
				os.Rename(filepath.Join(d, "tmp"), filepath.Join(d, "a.bin"))
			case "rewrite-keeping-mtime": // same inode, size and mtime: only ctime tells
				p := filepath.Join(d, "sub", "c.bin")
				fi, _ := os.Stat(p)
				os.WriteFile(p, []byte("CCCC"), 0o600)
				os.Chtimes(p, fi.ModTime(), fi.ModTime())
			}
			if err := got[0].Verify(); !errors.Is(err, ErrChanged) {
				t.Fatalf("Verify after %s: %v, want ErrChanged", change, err)
			}
		})
	}
}

// TestCommit_ChangedDuringUpload: the committer with a VerifyStore does
// not commit a checkpoint a file of which changes during the upload.
func TestCommit_ChangedDuringUpload(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone})
	d := filepath.Join(w.cfg.Dir, "checkpoint-7")
	testutil.WriteFile(t, filepath.Join(d, "a.bin"), "aaaa")
	t0 := time.Now()
	w.Scan(t0)
	cps := w.Scan(t0.Add(time.Hour))
	if len(cps) != 1 {
		t.Fatal("not complete")
	}
	cp := cps[0]
	fst, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hook := &touchStore{VerifyStore: NewVerifyStore(fst), touch: filepath.Join(d, "a.bin")}
	c := &commit.Committer{Store: hook, RunID: "r"}
	stage := stageIn(t, cp, "id1")
	done := hook.Expect(cp.Step, "id1", cp.Verify)
	_, err = c.Commit(t.Context(), commit.Request{Dir: stage, ID: "id1", Step: cp.Step, Metadata: cp.Metadata()})
	done()
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("commit err=%v, want ErrChanged", err)
	}
	if _, err := checkpoint.ReadLatest(t.Context(), fst); err == nil {
		t.Fatal("latest.json written for a checkpoint that changed during its upload")
	}
	// Once quiet again it is reported again, and commits.
	w.Retry(cp.Name)
	w.Scan(time.Now())
	cps = w.Scan(time.Now().Add(time.Hour))
	if len(cps) != 1 {
		t.Fatal("not reported again after Retry")
	}
	hook.touch = ""
	stage2 := stageIn(t, cps[0], "id2")
	defer hook.Expect(cps[0].Step, "id2", cps[0].Verify)()
	if _, err := c.Commit(t.Context(), commit.Request{Dir: stage2, ID: "id2", Step: 7, Metadata: cps[0].Metadata()}); err != nil {
		t.Fatal(err)
	}

	// Restore puts it back under its name into an empty directory.
	empty := t.TempDir()
	w2, _ := newWatcher(t, Config{Dir: empty})
	r, err := w2.Restore(t.Context(), fst, restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Path != filepath.Join(empty, "checkpoint-7") || testutil.ReadFile(t, filepath.Join(r.Path, "a.bin")) != "aaaamore" {
		t.Fatalf("restored %+v", r)
	}
	ents, _ := os.ReadDir(empty)
	if len(ents) != 1 {
		t.Fatalf("restore left %d entries in DIR, want 1", len(ents))
	}
}

// touchStore appends to a file once the first data object is uploaded.
type touchStore struct {
	*VerifyStore
	touch string
}

func (s *touchStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	if err := s.VerifyStore.Put(ctx, key, r, size, opts); err != nil {
		return err
	}
	if s.touch != "" && !strings.HasSuffix(key, "manifest.json") {
		f, err := os.OpenFile(s.touch, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		f.WriteString("more")
		f.Close()
		s.touch = ""
	}
	return nil
}

// stageIn stages cp in the watched directory as the agent does, under
// .stage/ID, and returns the staged directory's path.
func stageIn(t *testing.T, cp *Checkpoint, id string) string {
	t.Helper()
	root, err := os.OpenRoot(filepath.Dir(cp.Path))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := cp.StageIn(root, ".stage/"+id); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(cp.Path), ".stage", id)
}

// commitOne commits cp to st as the watch-mode agent does.
func commitOne(t *testing.T, st cloud.Store, cp *Checkpoint, id string) {
	t.Helper()
	vs := NewVerifyStore(st)
	stage := stageIn(t, cp, id)
	defer vs.Expect(cp.Step, id, cp.Verify)()
	c := &commit.Committer{Store: vs, RunID: "r"}
	if _, err := c.Commit(t.Context(), commit.Request{Dir: stage, ID: id, Step: cp.Step, Metadata: cp.Metadata()}); err != nil {
		t.Fatal(err)
	}
}

// TestRestore_FileAndAside: a file checkpoint comes back as the file; a
// different local copy of the same name and a newer torn HF directory are
// moved aside, not deleted; a protocol-mode checkpoint is refused clearly.
func TestRestore_FileAndAside(t *testing.T) {
	fst, _ := file.New(t.TempDir())
	w, _ := newWatcher(t, Config{Pattern: "*.pt"})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "model-30.pt"), "thirty")
	t0 := time.Now()
	w.Scan(t0)
	cps := w.Scan(t0.Add(time.Hour))
	if len(cps) != 1 {
		t.Fatal("not complete")
	}
	commitOne(t, fst, cps[0], "f1")

	dir := t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "model-30.pt"), "torn")
	w2, logs := newWatcher(t, Config{Dir: dir, Pattern: "*.pt"})
	r, err := w2.Restore(t.Context(), fst, restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, r.Path); r.Kind != kindFile || got != "thirty" {
		t.Fatalf("restored %s kind %s: %q", r.Path, r.Kind, got)
	}
	if logs.FilterMessage("moved a local checkpoint aside").Len() != 1 {
		t.Fatalf("the differing local copy was not moved aside: %v", logs.All())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("want the restored file and the one moved aside, got %d entries", len(ents))
	}

	// HF layout: a newer directory without trainer_state.json is torn.
	hst, _ := file.New(t.TempDir())
	w3, _ := newWatcher(t, Config{})
	testutil.WriteFile(t, filepath.Join(w3.cfg.Dir, "checkpoint-10", "m.bin"), "m")
	testutil.WriteFile(t, filepath.Join(w3.cfg.Dir, "checkpoint-10", HFMarker), "{}")
	w3.Scan(t0)
	cps = w3.Scan(t0.Add(time.Hour))
	commitOne(t, hst, cps[0], "h1")
	dir = t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-20", "m.bin"), "half")
	w4, _ := newWatcher(t, Config{Dir: dir})
	if _, err := w4.Restore(t.Context(), hst, restore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint-20")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the torn checkpoint-20 is still where the framework's resume would pick it")
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint-10", HFMarker)); err != nil {
		t.Fatal(err)
	}

	// A checkpoint without the watch metadata (protocol mode).
	pst, _ := file.New(t.TempDir())
	pd := t.TempDir()
	testutil.WriteFile(t, filepath.Join(pd, "state.pt"), "s")
	if _, err := (&commit.Committer{Store: pst, RunID: "r"}).Commit(t.Context(), commit.Request{Dir: pd, ID: "p1", Step: 3}); err != nil {
		t.Fatal(err)
	}
	w5, _ := newWatcher(t, Config{})
	if _, err := w5.Restore(t.Context(), pst, restore.Options{}); !errors.Is(err, ErrNotWatched) {
		t.Fatalf("restore of a protocol-mode checkpoint: %v, want ErrNotWatched", err)
	}
	if ents, _ := os.ReadDir(w5.cfg.Dir); len(ents) != 0 {
		t.Fatalf("a refused restore left %d entries", len(ents))
	}
}

// TestPrune: off unless called; keeps the newest, anything not older
// than the committed step, and what the agent says is busy.
func TestPrune(t *testing.T) {
	w, _ := newWatcher(t, Config{})
	for _, n := range []string{"checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"} {
		testutil.WriteFile(t, filepath.Join(w.cfg.Dir, n, "x"), "x")
	}
	gone := w.Prune(t.Context(), 3, 1, func(name string) bool { return name == "checkpoint-1" })
	if strings.Join(gone, ",") != "checkpoint-2" {
		t.Fatalf("pruned %v, want checkpoint-2 (checkpoint-1 is busy)", gone)
	}
	gone = w.Prune(t.Context(), 3, 1, nil)
	if strings.Join(gone, ",") != "checkpoint-1" {
		t.Fatalf("pruned %v, want checkpoint-1 once it is not busy", gone)
	}
	for _, n := range []string{"checkpoint-1", "checkpoint-2"} {
		if _, err := os.Lstat(filepath.Join(w.cfg.Dir, n)); !os.IsNotExist(err) {
			t.Fatalf("%s still there after prune: %v", n, err)
		}
	}
}

// TestScan_StagingIsNotAWrite: the agent's own hard links (staging, and
// removing the stage after the commit) move the files' ctimes; that must
// not make the checkpoint look written again and be reported twice.
func TestScan_StagingIsNotAWrite(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-3", "a.bin"), "a")
	t0 := time.Now()
	w.Scan(t0)
	cps := w.Scan(t0.Add(time.Hour))
	if len(cps) != 1 {
		t.Fatal("not complete")
	}
	stage := stageIn(t, cps[0], "s1")
	if got := w.Scan(t0.Add(2 * time.Hour)); len(got) != 0 {
		t.Fatalf("reported again after staging: %s", names(got))
	}
	if err := os.RemoveAll(stage); err != nil {
		t.Fatal(err)
	}
	if got := w.Scan(t0.Add(3 * time.Hour)); len(got) != 0 {
		t.Fatalf("reported again after the stage was removed: %s", names(got))
	}
	if w.Pending(0) {
		t.Fatal("pending after staging")
	}
}

// TestScan_WalkDoesNotHoldState: while a scan walks a checkpoint (long
// for a large one), Pending, Retry and NewestStep, which the agent's loop
// calls, answer at once.
func TestScan_WalkDoesNotHoldState(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-3", "a.bin"), "a")
	w.Scan(time.Now())
	walking, release := make(chan struct{}), make(chan struct{})
	testHookSnapshot = func(string) {
		close(walking)
		<-release
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		w.Scan(time.Now())
	}()
	<-walking
	testHookSnapshot = nil // read by the scan before it blocked
	answered := make(chan bool, 1)
	go func() {
		w.Retry("checkpoint-3")
		answered <- w.Pending(0) && w.NewestStep() == 3
	}()
	select {
	case ok := <-answered:
		if !ok {
			t.Fatal("checkpoint-3 not pending, or not the newest step")
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("Pending waited for the scan's walk")
	}
	close(release)
	<-scanned
}

// TestRestore_NewerUncommittedSaid: a complete checkpoint in DIR newer than
// the committed one (a file without marker; an HF directory with its
// marker) stays where it is, and the restore says that the framework's own
// resume will load it rather than the restored one.
func TestRestore_NewerUncommittedSaid(t *testing.T) {
	for _, tc := range []struct {
		name, pattern string
		committed     map[string]string
		newer         map[string]string
		newerName     string
	}{
		{"file", "*.pt", map[string]string{"model-30.pt": "thirty"}, map[string]string{"model-40.pt": "forty"}, "model-40.pt"},
		{"hf", "", map[string]string{"checkpoint-10/m.bin": "m", "checkpoint-10/" + HFMarker: "{}"},
			map[string]string{"checkpoint-20/m.bin": "m2", "checkpoint-20/" + HFMarker: "{}"}, "checkpoint-20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := file.New(t.TempDir())
			w, _ := newWatcher(t, Config{Pattern: tc.pattern})
			for n, b := range tc.committed {
				testutil.WriteFile(t, filepath.Join(w.cfg.Dir, n), b)
			}
			t0 := time.Now()
			w.Scan(t0)
			cps := w.Scan(t0.Add(time.Hour))
			if len(cps) != 1 {
				t.Fatal("not complete")
			}
			commitOne(t, st, cps[0], "c1")

			dir := t.TempDir()
			for n, b := range tc.newer {
				testutil.WriteFile(t, filepath.Join(dir, n), b)
			}
			w2, logs := newWatcher(t, Config{Dir: dir, Pattern: tc.pattern})
			if _, err := w2.Restore(t.Context(), st, restore.Options{}); err != nil {
				t.Fatal(err)
			}
			said := logs.FilterMessageSnippet("newer than the committed one").All()
			if len(said) != 1 || said[0].ContextMap()["name"] != tc.newerName {
				t.Fatalf("want one warning naming %s, got %v", tc.newerName, logs.All())
			}
			if _, err := os.Stat(filepath.Join(dir, tc.newerName)); err != nil {
				t.Fatalf("the newer complete checkpoint was moved: %v", err)
			}
		})
	}
}
