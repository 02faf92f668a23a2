package commit

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// countingStore counts the Puts per key, and can hold them until released.
type countingStore struct {
	cloud.Store
	mu   sync.Mutex
	puts map[string]int
	hold chan struct{} // when set, data Puts wait for it to close
}

func (s *countingStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	s.mu.Lock()
	if s.puts == nil {
		s.puts = map[string]int{}
	}
	s.puts[key]++
	hold := s.hold
	s.mu.Unlock()
	if hold != nil && !strings.HasSuffix(key, "manifest.json") && key != checkpoint.LatestKey {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Put(ctx, key, r, size, opts)
}

func (s *countingStore) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts[key]
}

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// restoredFiles restores the newest checkpoint and returns its files.
func restoredFiles(t *testing.T, st cloud.Store) (int64, map[string]string) {
	t.Helper()
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range r.Manifest.Files {
		b, err := os.ReadFile(filepath.Join(r.Dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		got[f.Path] = string(b)
	}
	return r.Manifest.Step, got
}

func TestPipeline_UploadsEarlyOnce(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t), hold: make(chan struct{})}
	files := map[string]string{"model.pt": strings.Repeat("m", 300000), "sub/opt.pt": "optimizer", "late": "written after"}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": files["model.pt"], "sub/opt.pt": files["sub/opt.pt"]})
	root := openRoot(t, dir)
	core, logs := observer.New(zap.InfoLevel)
	c := &Committer{Store: st, RunID: "run", Log: zap.New(core)}
	p := c.NewPipeline(context.Background(), root, 7, "abc")
	for _, rel := range []string{"model.pt", "sub/opt.pt"} {
		if err := p.Add(rel); err != nil {
			t.Fatalf("add %s: %v", rel, err)
		}
	}
	// The uploads started before done: both Puts are in the store's hands.
	key := checkpoint.Prefix(7, "abc") + "model.pt"
	deadline := time.Now().Add(10 * time.Second)
	for st.count(key) == 0 || st.count(checkpoint.Prefix(7, "abc")+"sub/opt.pt") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no upload started before done")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "late"), []byte(files["late"]), 0o600); err != nil {
		t.Fatal(err)
	}
	close(st.hold)
	res, err := c.Commit(context.Background(), Request{Root: root, ID: "abc", Step: 7, Reason: "periodic", Pipeline: p})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(res.Manifest.Files), 3; got != want {
		t.Fatalf("files=%d, want %d", got, want)
	}
	for rel := range files {
		if got, want := st.count(checkpoint.Prefix(7, "abc")+rel), 1; got != want {
			t.Errorf("puts of %s=%d, want %d", rel, got, want)
		}
	}
	// The log's durations add up (#47: "total" was once shorter than
	// "upload", which counted the early uploads from before the call).
	committed := logs.FilterMessage("checkpoint committed").All()
	if len(committed) != 1 {
		t.Fatalf("%d \"checkpoint committed\" lines, want 1", len(committed))
	}
	f := committed[0].ContextMap()
	up, cm, total := f["upload_s"].(float64), f["commit_s"].(float64), f["total_s"].(float64)
	t.Logf("upload_s %v, commit_s %v, total_s %v", up, cm, total)
	if up <= 0 || cm <= 0 || up > total || cm > total {
		t.Errorf("upload_s %v, commit_s %v, total_s %v: want each part positive and at most the total", up, cm, total)
	}
	step, got := restoredFiles(t, st)
	if step != 7 {
		t.Fatalf("step=%d, want 7", step)
	}
	for rel, body := range files {
		if got[rel] != body {
			t.Errorf("%s restored as %.20q, want %.20q", rel, got[rel], body)
		}
	}
}

// A file rewritten after `saved` (same size, other bytes, even with its
// mtime put back) is uploaded again: the manifest never lists the old
// bytes under the new file's name.
func TestPipeline_FileChangedAfterSaved(t *testing.T) {
	for _, name := range []string{"rewritten", "rewritten, mtime restored", "replaced", "removed"} {
		t.Run(name, func(t *testing.T) {
			st := &countingStore{Store: cptest.NewStore(t)}
			dir := cptest.WriteDir(t, map[string]string{"model.pt": strings.Repeat("a", 100000), "keep": "k"})
			root := openRoot(t, dir)
			c := &Committer{Store: st, RunID: "run"}
			p := c.NewPipeline(context.Background(), root, 3, "chg")
			if err := p.Add("model.pt"); err != nil {
				t.Fatal(err)
			}
			p.wg.Wait() // the early upload is complete
			path := filepath.Join(dir, "model.pt")
			fi, _ := os.Stat(path)
			want := strings.Repeat("b", 100000)
			switch name {
			case "rewritten", "rewritten, mtime restored":
				f, err := os.OpenFile(path, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteAt([]byte(want), 0)
				f.Close()
				if name == "rewritten, mtime restored" {
					os.Chtimes(path, fi.ModTime(), fi.ModTime())
				}
			case "replaced":
				os.WriteFile(path+".tmp", []byte(want), 0o600)
				os.Rename(path+".tmp", path)
			case "removed":
				os.Remove(path)
				want = ""
			}
			_, err := c.Commit(context.Background(), Request{Root: root, ID: "chg", Step: 3, Reason: "periodic", Pipeline: p})
			if err != nil {
				t.Fatal(err)
			}
			_, got := restoredFiles(t, st)
			if got["model.pt"] != want {
				t.Fatalf("model.pt committed as %.10q…, want %.10q…", got["model.pt"], want)
			}
			if name == "removed" {
				// The early object is not left behind under the checkpoint.
				deadline := time.Now().Add(10 * time.Second)
				for {
					_, err := st.Stat(context.Background(), checkpoint.Prefix(3, "chg")+"model.pt")
					if errors.Is(err, cloud.ErrNotExist) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("early upload of a removed file still in the store: %v", err)
					}
					time.Sleep(10 * time.Millisecond)
				}
			} else if got, want := st.count(checkpoint.Prefix(3, "chg")+"model.pt"), 2; got != want {
				t.Fatalf("puts of model.pt=%d, want %d (uploaded again)", got, want)
			}
		})
	}
}

// A file written to while it is uploaded is never taken as uploaded.
func TestPipeline_ChangedDuringUpload(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t), hold: make(chan struct{})}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": strings.Repeat("a", 1<<20)})
	root := openRoot(t, dir)
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), root, 1, "dur")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st.count(checkpoint.Prefix(1, "dur")+"model.pt") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("upload did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	want := strings.Repeat("z", 1<<20)
	if err := os.WriteFile(filepath.Join(dir, "model.pt"), []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	close(st.hold)
	if _, err := c.Commit(context.Background(), Request{Root: root, ID: "dur", Step: 1, Reason: "periodic", Pipeline: p}); err != nil {
		t.Fatal(err)
	}
	if _, got := restoredFiles(t, st); got["model.pt"] != want {
		t.Fatal("a file changed during its early upload was committed torn or stale")
	}
}

func TestPipeline_AddRefuses(t *testing.T) {
	dir := cptest.WriteDir(t, map[string]string{"model.pt": "m", "sub/x": "x"})
	outside := cptest.WriteDir(t, map[string]string{"secret": "s"})
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link"))
	os.Symlink("model.pt", filepath.Join(dir, "inner-link"))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: cptest.NewStore(t)}
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), openRoot(t, dir), 1, "bad")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rel  string
		want error
	}{
		{"model.pt", ErrDuplicate},
		{"../secret", checkpoint.ErrUnsafePath},
		{"/etc/passwd", checkpoint.ErrUnsafePath},
		{"sub/../model.pt", checkpoint.ErrUnsafePath},
		{"missing", fs.ErrNotExist},
		{"link", nil},
		{"inner-link", nil},
		{"fifo", checkpoint.ErrRefused},
		{"sub", checkpoint.ErrRefused},
	} {
		err := p.Add(tc.rel)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("Add(%q)=%v, want %v", tc.rel, err, tc.want)
		}
	}
	p.wg.Wait()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.puts) != 1 {
		t.Fatalf("puts=%v, want model.pt only", st.puts)
	}
}

// An aborted pipeline leaves nothing in the store, and nothing restorable.
func TestPipeline_Abort(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t)}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": "m"})
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), openRoot(t, dir), 1, "abt")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	p.Abort()
	if err := p.Add("other"); err == nil {
		t.Fatal("Add after Abort succeeded")
	}
	p.Wait() // the upload and the deletes end before the test's temp dirs go
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		st.List(context.Background(), "", func(cloud.ObjectInfo) error { n++; return nil })
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d objects left after Abort", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{}); err == nil {
		t.Fatal("an aborted pipeline restored")
	}
}

// TestPipeline_DeathAfterEarlyUploads: the agent dies (SIGKILL: no
// Commit, no Abort, no cleanup) after a file of a pipelined checkpoint was
// uploaded early and before done: the store at that moment holds the early
// object, and nothing of it restores; the checkpoint before it does, and
// latest.json still names that one. (The end-to-end
// TestPipeline_AgentKilledMidPipeline until #49; that the agent starts a
// pipeline at a trainer's `saved` is TestAgent_Saved*, and the store
// protocol under a death at every operation is TestSim.)
func TestPipeline_DeathAfterEarlyUploads(t *testing.T) {
	st := cptest.NewStore(t)
	c := &Committer{Store: st, RunID: "run"}
	before := cptest.WriteDir(t, map[string]string{"model.pt": "step 5"})
	if _, err := c.Commit(context.Background(), Request{Root: openRoot(t, before), ID: "five", Step: 5, Reason: "periodic"}); err != nil {
		t.Fatal(err)
	}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": strings.Repeat("m", 300000), "opt.pt": "o"})
	ctx, cancel := context.WithCancel(context.Background())
	p := c.NewPipeline(ctx, openRoot(t, dir), 7, "seven")
	t.Cleanup(func() { cancel(); p.Wait() })
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	key := checkpoint.Prefix(7, "seven") + "model.pt"
	deadline := time.Now().Add(10 * time.Second)
	for {
		if o, err := st.Stat(context.Background(), key); err == nil && o.Size == 300000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the early upload never landed")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by deadline
	}
	// The agent is gone here: the store is what it left.
	step, got := restoredFiles(t, st)
	if step != 5 || got["model.pt"] != "step 5" {
		t.Fatalf("restored step %d (%d files), want step 5: the half-uploaded checkpoint must never restore", step, len(got))
	}
	if l, err := checkpoint.ReadLatest(context.Background(), st); err != nil || l.Step != 5 {
		t.Fatalf("latest=%+v err=%v, want step 5", l, err)
	}
}

// lostManifestReply loses the reply of every manifest put: the manifest
// lands, the committer sees an error.
type lostManifestReply struct{}

func (lostManifestReply) Before(context.Context, storesim.Op) error { return nil }

func (lostManifestReply) After(_ context.Context, op storesim.Op, err error) error {
	if err == nil && op.Kind == storesim.OpPut && strings.HasSuffix(op.Key, "/"+checkpoint.ManifestName) {
		return storesim.ErrLost
	}
	return err
}

// A commit whose manifest write fails after the manifest landed (its reply
// lost) keeps the early uploads the manifest names when the agent then
// aborts the pipeline, as it does after any failed commit: deleting them
// would leave a committed manifest whose objects are gone, which restore
// refuses as damaged (found by the agent simulation, seed 83).
func TestPipeline_ManifestReplyLostKeepsEarlyUploads(t *testing.T) {
	st := storesim.New()
	st.Faults = lostManifestReply{}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": strings.Repeat("m", 1000), "opt.pt": "o"})
	root := openRoot(t, dir)
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), root, 3, "lost")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(context.Background(), Request{Root: root, ID: "lost", Step: 3, Reason: "periodic", Pipeline: p}); !errors.Is(err, storesim.ErrLost) {
		t.Fatalf("commit: %v, want the lost reply", err)
	}
	p.Abort()
	p.Wait()
	st.Faults = nil
	step, got := restoredFiles(t, st)
	if step != 3 || got["model.pt"] != strings.Repeat("m", 1000) || got["opt.pt"] != "o" {
		t.Fatalf("restored step %d, %d files: want step 3 whole", step, len(got))
	}
}

// An abort whose parent context has ended (the agent is exiting) still
// deletes the early uploads: the deletion outlives the parent by up to 10 s.
func TestPipeline_AbortAfterParentEnded(t *testing.T) {
	st := cptest.NewStore(t)
	dir := cptest.WriteDir(t, map[string]string{"model.pt": "m"})
	c := &Committer{Store: st, RunID: "run"}
	parent, end := context.WithCancel(context.Background())
	p := c.NewPipeline(parent, openRoot(t, dir), 1, "par")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	key := checkpoint.Prefix(1, "par") + "model.pt"
	deadline := time.Now().Add(10 * time.Second)
	for _, err := st.Stat(context.Background(), key); err != nil; _, err = st.Stat(context.Background(), key) {
		if time.Now().After(deadline) {
			t.Fatalf("early upload never landed: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	end()
	p.Abort()
	p.Wait()
	if _, err := st.Stat(context.Background(), key); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("early upload still there after Abort with the parent ended (stat: %v)", err)
	}
}

// done with another step than the pipeline's: the manifest points at the
// early objects, and the checkpoint restores.
func TestPipeline_OtherStepAtDone(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t)}
	dir := cptest.WriteDir(t, map[string]string{"model.pt": "m", "b": "bb"})
	root := openRoot(t, dir)
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), root, 5, "stp")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(context.Background(), Request{Root: root, ID: "stp", Step: 6, Reason: "periodic", Pipeline: p}); err != nil {
		t.Fatal(err)
	}
	step, got := restoredFiles(t, st)
	if step != 6 || got["model.pt"] != "m" || got["b"] != "bb" {
		t.Fatalf("restored step %d files %v", step, got)
	}
	if n := st.count(checkpoint.Prefix(6, "stp") + "model.pt"); n != 0 {
		t.Fatalf("model.pt uploaded again under the done step (%d)", n)
	}
}

// A halted pipeline (an interruption needs the bandwidth) and one under a
// Gate (node mode) upload nothing early; Add still checks; done uploads all.
func TestPipeline_HaltedAndGated(t *testing.T) {
	for _, name := range []string{"halted", "gated"} {
		t.Run(name, func(t *testing.T) {
			st := &countingStore{Store: cptest.NewStore(t)}
			dir := cptest.WriteDir(t, map[string]string{"a": "1", "b": "2"})
			root := openRoot(t, dir)
			c := &Committer{Store: st, RunID: "run"}
			if name == "gated" {
				c.Gate = NewGate(1)
			}
			p := c.NewPipeline(context.Background(), root, 1, "hlt")
			if name == "halted" {
				p.Halt()
			}
			if err := p.Add("a"); err != nil {
				t.Fatal(err)
			}
			if err := p.Add("a"); !errors.Is(err, ErrDuplicate) {
				t.Fatalf("second Add: %v, want ErrDuplicate", err)
			}
			if err := p.Add("../x"); !errors.Is(err, checkpoint.ErrUnsafePath) {
				t.Fatalf("Add(../x): %v", err)
			}
			p.wg.Wait()
			if n := st.count(checkpoint.Prefix(1, "hlt") + "a"); n != 0 {
				t.Fatalf("uploaded early %d times", n)
			}
			if _, err := c.Commit(context.Background(), Request{Root: root, ID: "hlt", Step: 1, Reason: "periodic", Pipeline: p}); err != nil {
				t.Fatal(err)
			}
			if _, got := restoredFiles(t, st); got["a"] != "1" || got["b"] != "2" {
				t.Fatalf("restored %v", got)
			}
		})
	}
}

// A file reported saved right after its last write is read once: the
// upload waits out the rest of racyWindow instead of reading the whole
// file again at done to prove it unchanged. A write after the wait moves
// its mtime, so it is still caught.
func TestPipeline_JustWrittenReadOnce(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t)}
	dir := t.TempDir()
	path := filepath.Join(dir, "model.pt")
	if err := os.WriteFile(path, []byte(strings.Repeat("m", 100000)), 0o600); err != nil {
		t.Fatal(err)
	}
	root := openRoot(t, dir)
	c := &Committer{Store: st, RunID: "run"}
	p := c.NewPipeline(context.Background(), root, 5, "fresh")
	if err := p.Add("model.pt"); err != nil {
		t.Fatal(err)
	}
	p.wg.Wait()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f := p.files["model.pt"]
	if f.err != nil || f.racy {
		t.Fatalf("early upload err=%v racy=%v, want a clean, non-racy upload", f.err, f.racy)
	}
	if f.ident != checkpoint.IdentOf(fi) {
		t.Fatal("uploaded identity differs from the file's")
	}
	// Rewritten now (same size): mtime and ctime move, so done uploads it again.
	want := strings.Repeat("n", 100000)
	if err := os.WriteFile(path, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(context.Background(), Request{Root: root, ID: "fresh", Step: 5, Reason: "periodic", Pipeline: p}); err != nil {
		t.Fatal(err)
	}
	if _, got := restoredFiles(t, st); got["model.pt"] != want {
		t.Fatalf("model.pt committed as %.10q…, want %.10q…", got["model.pt"], want)
	}
	if n := st.count(checkpoint.Prefix(5, "fresh") + "model.pt"); n != 2 {
		t.Fatalf("puts of model.pt=%d, want 2", n)
	}
}
