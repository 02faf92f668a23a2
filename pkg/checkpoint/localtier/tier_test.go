package localtier

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// countingStore counts the bytes read from each object.
type countingStore struct {
	cloud.Store
	mu   sync.Mutex
	read map[string]int64
}

func (c *countingStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := c.Store.Get(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return &countedBody{ReadCloser: rc, c: c, key: key}, nil
}

type countedBody struct {
	io.ReadCloser
	c   *countingStore
	key string
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.mu.Lock()
	b.c.read[b.key] += int64(n)
	b.c.mu.Unlock()
	return n, err
}

// dataRead is the bytes read from objects other than manifests and
// latest.json, by key.
func (c *countingStore) dataRead() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for k, n := range c.read {
		if n > 0 && !strings.HasSuffix(k, "manifest.json") && k != checkpoint.LatestKey {
			out[k] = n
		}
	}
	return out
}

// rig is a checkpoint directory (the tier's parent), a store and a tier.
type rig struct {
	t      *testing.T
	dir    string
	parent *os.Root
	st     *countingStore
	tier   *Tier
}

func newRig(t *testing.T, opts Options) *rig {
	t.Helper()
	dir := t.TempDir()
	parent, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parent.Close() })
	tier, err := Open(parent, "area/committed", opts)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, dir: dir, parent: parent, st: &countingStore{Store: storesim.New(), read: map[string]int64{}}, tier: tier}
}

var files = []string{"model.bin", "optim/rank0.bin", "meta.json"}

// save writes a trainer's request directory for step and returns its
// files' contents.
func (r *rig) save(name string, step int64) map[string][]byte {
	r.t.Helper()
	rng := rand.New(rand.NewPCG(uint64(step), 1))
	out := map[string][]byte{}
	for i, f := range files {
		b := make([]byte, 100_000*(i+1))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		p := filepath.Join(r.dir, name, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			r.t.Fatal(err)
		}
		out[f] = b
	}
	return out
}

// commit commits request directory name as checkpoint id at step.
func (r *rig) commit(name, id string, step int64) *checkpoint.Manifest {
	r.t.Helper()
	c := &commit.Committer{Store: r.st.Store, RunID: "run"}
	res, err := c.Commit(context.Background(), commit.Request{Dir: filepath.Join(r.dir, name), ID: id, Step: step, Reason: "periodic"})
	if err != nil {
		r.t.Fatal(err)
	}
	return res.Manifest
}

// saveCommitKeep is what the agent does: the trainer saves, the commit
// lands, the tier keeps the files, the request directory goes.
func (r *rig) saveCommitKeep(id string, step int64) (*checkpoint.Manifest, map[string][]byte) {
	r.t.Helper()
	want := r.save("req-"+id, step)
	m := r.commit("req-"+id, id, step)
	if err := r.tier.Keep(context.Background(), "req-"+id, m, "", true); err != nil {
		r.t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(r.dir, "req-"+id)); err != nil {
		r.t.Fatal(err)
	}
	return m, want
}

func (r *rig) restore() *restore.Result {
	r.t.Helper()
	res, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(r.dir, "area", "restore"), restore.Options{Tiers: []checkpoint.Tier{r.tier}})
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

func (r *rig) keptPath(m *checkpoint.Manifest, f string) string {
	return filepath.Join(r.dir, "area", "committed", dirName(m), f)
}

func checkFiles(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	for f, b := range want {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("%s: restored content differs", f)
		}
	}
}

func TestRestoreFromLocal(t *testing.T) {
	r := newRig(t, Options{})
	m, want := r.saveCommitKeep("c1", 10)
	res := r.restore()
	if got := r.st.dataRead(); len(got) != 0 {
		t.Fatalf("data read from the store: %v, want none", got)
	}
	if got, want := res.From[checkpoint.FromLocal], m.Bytes(); got != want {
		t.Fatalf("From[local]=%d, want %d", got, want)
	}
	if got := res.From[checkpoint.FromStore]; got != 0 {
		t.Fatalf("From[store]=%d, want 0", got)
	}
	checkFiles(t, res.Dir, want)
}

func TestDamagedLocalFileComesFromStore(t *testing.T) {
	damage := map[string]func(p string) error{
		"corrupt": func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0xff
			return os.WriteFile(p, b, 0o600) // in place: the same size
		},
		"truncated": func(p string) error { return os.Truncate(p, 10) },
		"missing":   os.Remove,
		"symlink": func(p string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink("../../../elsewhere", p)
		},
	}
	for name, fn := range damage {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, Options{})
			m, want := r.saveCommitKeep("c1", 10)
			bad := m.Files[slices.IndexFunc(m.Files, func(f checkpoint.File) bool { return f.Path == "optim/rank0.bin" })]
			if err := fn(r.keptPath(m, bad.Path)); err != nil {
				t.Fatal(err)
			}
			res := r.restore()
			got := r.st.dataRead()
			if len(got) != 1 || got[bad.Key] != bad.Size {
				t.Fatalf("data read from the store: %v, want only %s (%d bytes)", got, bad.Key, bad.Size)
			}
			if res.From[checkpoint.FromStore] != bad.Size || res.From[checkpoint.FromLocal] != m.Bytes()-bad.Size {
				t.Fatalf("From=%v, want store %d, local %d", res.From, bad.Size, m.Bytes()-bad.Size)
			}
			checkFiles(t, res.Dir, want)
		})
	}
}

// A trainer that rewrites a file of its request directory in place after
// the commit changes the kept copy too (a hard link): restore sees it.
func TestRewrittenInPlaceAfterKeep(t *testing.T) {
	r := newRig(t, Options{})
	want := r.save("req", 10)
	m := r.commit("req", "c1", 10)
	if err := r.tier.Keep(context.Background(), "req", m, "", true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "req", "model.bin"), bytes.Repeat([]byte{7}, len(want["model.bin"])), 0o600); err != nil {
		t.Fatal(err)
	}
	res := r.restore()
	if got := r.st.dataRead(); len(got) != 1 {
		t.Fatalf("data read from the store: %v, want model.bin only", got)
	}
	checkFiles(t, res.Dir, want)
}

func TestNewerCommitInStoreWins(t *testing.T) {
	r := newRig(t, Options{})
	r.saveCommitKeep("c1", 10)
	want := r.save("req-c2", 20) // committed by another machine: not kept here
	m2 := r.commit("req-c2", "c2", 20)
	res := r.restore()
	if res.Manifest.Step != 20 {
		t.Fatalf("restored step %d, want 20", res.Manifest.Step)
	}
	if got := res.From[checkpoint.FromStore]; got != m2.Bytes() {
		t.Fatalf("From[store]=%d, want %d", got, m2.Bytes())
	}
	checkFiles(t, res.Dir, want)
}

// A newer save that never committed (the request directory, a copy
// staged by a Keep that was cut short, or a copy of a checkpoint the
// store has no manifest for) is never restored.
func TestUncommittedNewerLocalNeverUsed(t *testing.T) {
	r := newRig(t, Options{})
	_, want := r.saveCommitKeep("c1", 10)
	r.save("req-c3", 30) // the trainer's half-written newer save
	newer := &checkpoint.Manifest{Step: 30, ID: "c3"}
	for _, d := range []string{staging + "x", dirName(newer)} {
		if err := os.CopyFS(filepath.Join(r.dir, "area", "committed", d), os.DirFS(filepath.Join(r.dir, "req-c3"))); err != nil {
			t.Fatal(err)
		}
	}
	tier, err := Open(r.parent, "area/committed", Options{}) // a restart
	if err != nil {
		t.Fatal(err)
	}
	r.tier = tier
	if _, err := os.Stat(filepath.Join(r.dir, "area", "committed", staging+"x")); !os.IsNotExist(err) {
		t.Fatalf("a staged copy survived Open: %v", err)
	}
	res := r.restore()
	if res.Manifest.Step != 10 {
		t.Fatalf("restored step %d, want 10", res.Manifest.Step)
	}
	if got := r.st.dataRead(); len(got) != 0 {
		t.Fatalf("data read from the store: %v, want none", got)
	}
	checkFiles(t, res.Dir, want)
}

func TestBudget(t *testing.T) {
	kept := func(r *rig) []string {
		var out []string
		for _, n := range names(must(r.tier.dir())) {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	t.Run("newest only by default", func(t *testing.T) {
		r := newRig(t, Options{})
		r.saveCommitKeep("c1", 10)
		r.saveCommitKeep("c3", 30)
		r.saveCommitKeep("c2", 20) // a rollback: step 30 is still the newest
		if got, want := kept(r), []string{"000000000030-c3"}; !slices.Equal(got, want) {
			t.Fatalf("kept %v, want %v", got, want)
		}
	})
	t.Run("keep 2", func(t *testing.T) {
		r := newRig(t, Options{Keep: 2})
		for i, id := range []string{"c1", "c2", "c3"} {
			r.saveCommitKeep(id, int64(10*(i+1)))
		}
		if got, want := kept(r), []string{"000000000020-c2", "000000000030-c3"}; !slices.Equal(got, want) {
			t.Fatalf("kept %v, want %v", got, want)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		r := newRig(t, Options{Keep: 5, MaxBytes: 700_000}) // one checkpoint is 600,000 bytes
		r.saveCommitKeep("c1", 10)
		r.saveCommitKeep("c2", 20)
		if got, want := kept(r), []string{"000000000020-c2"}; !slices.Equal(got, want) {
			t.Fatalf("kept %v, want %v", got, want)
		}
		r.tier.opts.MaxBytes = 500_000
		r.saveCommitKeep("c3", 30) // larger than the budget: not kept, and the older copy stays
		if got, want := kept(r), []string{"000000000020-c2"}; !slices.Equal(got, want) {
			t.Fatalf("kept %v, want %v", got, want)
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Keep links, never copies, on one file system: the kept copy costs no
// bytes while the request directory exists, and no write at all.
func TestKeepLinks(t *testing.T) {
	r := newRig(t, Options{})
	r.save("req", 10)
	m := r.commit("req", "c1", 10)
	if err := r.tier.Keep(context.Background(), "req", m, "", true); err != nil {
		t.Fatal(err)
	}
	a, err := os.Stat(filepath.Join(r.dir, "req", "model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(r.keptPath(m, "model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(a, b) {
		t.Fatal("kept file is a copy, want a hard link")
	}
}

// Where a hard link is refused (another file system, protected_hardlinks),
// Keep copies each file through its manifest checksum; for a checkpoint
// someone waits for (copyOK false) it keeps nothing rather than copy.
func TestKeepCopies(t *testing.T) {
	link = func(*os.Root, string, string) error { return os.ErrPermission }
	t.Cleanup(func() { link = (*os.Root).Link })
	t.Run("copy", func(t *testing.T) {
		r := newRig(t, Options{})
		m, want := r.saveCommitKeep("c1", 10)
		res := r.restore()
		if got := r.st.dataRead(); len(got) != 0 || res.From[checkpoint.FromLocal] != m.Bytes() {
			t.Fatalf("data read from the store: %v, From %v", got, res.From)
		}
		checkFiles(t, res.Dir, want)
	})
	t.Run("no time to copy", func(t *testing.T) {
		r := newRig(t, Options{})
		r.save("req", 10)
		m := r.commit("req", "c1", 10)
		if err := r.tier.Keep(context.Background(), "req", m, "", false); err == nil {
			t.Fatal("Keep without links nor copies: no error")
		}
		if n := names(must(r.tier.dir())); len(n) != 0 {
			t.Fatalf("tier holds %v, want nothing", n)
		}
	})
	t.Run("changed since the commit", func(t *testing.T) {
		r := newRig(t, Options{})
		want := r.save("req", 10)
		m := r.commit("req", "c1", 10)
		os.WriteFile(filepath.Join(r.dir, "req", "meta.json"), bytes.Repeat([]byte{1}, len(want["meta.json"])), 0o600)
		if err := r.tier.Keep(context.Background(), "req", m, "", true); err == nil {
			t.Fatal("Keep copied a file that differs from its manifest")
		}
		if n := names(must(r.tier.dir())); len(n) != 0 {
			t.Fatalf("tier holds %v, want nothing", n)
		}
	})
}

// A node of a job keeps its own part: it restores that part with no data
// byte from the store; another node's part, or every part (--restore
// all), reads from the store only what this node does not hold.
func TestKeepPart(t *testing.T) {
	r := newRig(t, Options{})
	parts := []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0, 1}, WorldSize: 4}, {Node: "node-1", Ranks: []int{2, 3}, WorldSize: 4}}
	res := make([]*commit.Result, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		for _, rank := range p.Ranks {
			fp := filepath.Join(r.dir, "req-"+p.Node, "rank-"+string(rune('0'+rank))+".pt")
			os.MkdirAll(filepath.Dir(fp), 0o700)
			if err := os.WriteFile(fp, bytes.Repeat([]byte{byte(rank)}, 1000*(rank+1)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		wg.Go(func() {
			c := &commit.Committer{Store: r.st.Store, RunID: "run"}
			res[i], errs[i] = c.Commit(context.Background(), commit.Request{Dir: filepath.Join(r.dir, "req-"+p.Node), ID: "j1", Step: 7, Part: &p})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	m := res[0].Manifest
	if err := r.tier.Keep(context.Background(), "req-node-0", m, "node-0", true); err != nil {
		t.Fatal(err)
	}
	bytesOf := func(node string) int64 {
		var n int64
		for _, f := range m.Files {
			if f.Part == node || node == "" {
				n += f.Size
			}
		}
		return n
	}
	for _, c := range []struct{ part, from string }{{"node-0", "local"}, {"node-1", "store"}, {"", "local+store"}} {
		t.Run("part="+c.part, func(t *testing.T) {
			r.st.read = map[string]int64{}
			got, err := restore.Checkpoint(context.Background(), r.st, filepath.Join(r.dir, "restore-"+c.part), restore.Options{Part: c.part, Tiers: []checkpoint.Tier{r.tier}})
			if err != nil {
				t.Fatal(err)
			}
			var read int64
			for _, n := range r.st.dataRead() {
				read += n
			}
			wantStore := bytesOf(c.part)
			if c.part != "node-1" {
				wantStore -= bytesOf("node-0")
			}
			if journal.Sources(got.From) != c.from || read != wantStore || got.From[checkpoint.FromStore] != wantStore {
				t.Fatalf("from %v, %d data bytes read from the store; want %s, %d", got.From, read, c.from, wantStore)
			}
		})
	}
}

// Two parts may hold a file of the same path (the manifest allows it):
// the copy of another node's part (AddPart, --replicas 1) is kept apart
// from this node's own, so neither overwrites the other, each part reads
// back its own bytes, and both go when the copy is dropped (review M2).
func TestAddPartSamePathAsOwn(t *testing.T) {
	r := newRig(t, Options{Keep: 1})
	parts := []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0}, WorldSize: 2}, {Node: "node-1", Ranks: []int{1}, WorldSize: 2}}
	content := map[string][]byte{"node-0": bytes.Repeat([]byte("node zero;"), 1000), "node-1": bytes.Repeat([]byte("node one;;"), 1000)}
	commitJob := func(id string, step int64) *checkpoint.Manifest { return r.commitJob(parts, content, id, step) }
	m := commitJob("j1", 7)
	if err := r.tier.Keep(context.Background(), "req-j1-node-0", m, "node-0", true); err != nil {
		t.Fatal(err)
	}
	fromStore := func(ctx context.Context, f checkpoint.File) (io.ReadCloser, error) {
		return r.st.Get(ctx, f.Key, 0, -1)
	}
	if err := r.tier.AddPart(context.Background(), m, "node-1", fromStore); err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		rc, err := r.tier.Open(context.Background(), m, f)
		if err != nil {
			t.Fatalf("%s of %s: %v", f.Path, f.Part, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, content[f.Part]) {
			t.Fatalf("%s of %s: %.20q (%v), want %.20q", f.Path, f.Part, got, err, content[f.Part])
		}
	}
	if got := r.tier.Held(); len(got) != 1 {
		t.Fatalf("held %v, want the one checkpoint", got)
	}
	// A newer copy drops the older one with its other part.
	m2 := commitJob("j2", 8)
	if err := r.tier.Keep(context.Background(), "req-j2-node-0", m2, "node-0", true); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(r.dir, filepath.FromSlash(r.tier.rel)))
	for _, e := range left {
		if strings.HasPrefix(e.Name(), dirName(m)) {
			t.Fatalf("%s left after its copy was dropped", e.Name())
		}
	}
}

// A kept file asked for with another size is refused as such, not as a
// file that changed after a scan (review m3).
func TestOpenOtherSizeSaysSo(t *testing.T) {
	r := newRig(t, Options{})
	m, _ := r.saveCommitKeep("a1", 1)
	f := m.Files[0]
	f.Size++
	_, err := r.tier.Open(context.Background(), m, f)
	if err == nil || strings.Contains(err.Error(), "scan") || !strings.Contains(err.Error(), "the manifest says") {
		t.Fatalf("open with another size: %v", err)
	}
}

// commitJob commits job checkpoint id at step, each part's node saving
// model.bin and sub/opt.bin with content[node].
func (r *rig) commitJob(parts []checkpoint.PartSpec, content map[string][]byte, id string, step int64) *checkpoint.Manifest {
	r.t.Helper()
	res := make([]*commit.Result, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		src := filepath.Join(r.dir, "req-"+id+"-"+p.Node)
		os.MkdirAll(filepath.Join(src, "sub"), 0o700)
		for _, f := range []string{"model.bin", "sub/opt.bin"} {
			if err := os.WriteFile(filepath.Join(src, f), content[p.Node], 0o600); err != nil {
				r.t.Fatal(err)
			}
		}
		wg.Go(func() {
			c := &commit.Committer{Store: r.st.Store, RunID: "run"}
			res[i], errs[i] = c.Commit(context.Background(), commit.Request{Dir: src, ID: id, Step: step, Part: &p})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			r.t.Fatal(err)
		}
	}
	return res[0].Manifest
}

// A Keep of this node's newest checkpoint does not wait for a copy of
// another node's part that is still reading from its peers (AddPart):
// the transfer runs outside the tier's lock. It waited for the whole
// transfer before (the agent's simulation, seed 2669, where the wait on
// the lock stopped the bubble's clock).
func TestKeepDoesNotWaitForAddPart(t *testing.T) {
	r := newRig(t, Options{Keep: 2})
	parts := []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0}, WorldSize: 2}, {Node: "node-1", Ranks: []int{1}, WorldSize: 2}}
	content := map[string][]byte{"node-0": bytes.Repeat([]byte("node zero;"), 1000), "node-1": bytes.Repeat([]byte("node one;;"), 1000)}
	m := r.commitJob(parts, content, "j1", 7)
	if err := r.tier.Keep(context.Background(), "req-j1-node-0", m, "node-0", true); err != nil {
		t.Fatal(err)
	}
	reading, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slowPeer := func(ctx context.Context, f checkpoint.File) (io.ReadCloser, error) {
		once.Do(func() { close(reading) })
		<-release
		return r.st.Get(ctx, f.Key, 0, -1)
	}
	added := make(chan error, 1)
	go func() { added <- r.tier.AddPart(context.Background(), m, "node-1", slowPeer) }()
	<-reading
	m2 := r.commitJob(parts, content, "j2", 8)
	kept := make(chan error, 1)
	go func() { kept <- r.tier.Keep(context.Background(), "req-j2-node-0", m2, "node-0", true) }()
	select {
	case err := <-kept:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("Keep waited for another node's part still being read from a peer")
	}
	close(release)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	held := r.tier.Held()
	if !slices.Equal(held, []string{dirName(m2), dirName(m)}) {
		t.Fatalf("held %v, want both copies, newest first", held)
	}
	for _, f := range m.Files {
		if _, err := r.tier.Open(context.Background(), m, f); err != nil {
			t.Fatalf("%s of %s, its copy kept before or added after the Keep: %v", f.Path, f.Part, err)
		}
	}
}
