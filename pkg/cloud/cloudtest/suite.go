// Package cloudtest is the conformance suite every cloud.Store backend runs.
package cloudtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Run runs the conformance suite. newStore returns an empty store that no
// other subtest uses (a fresh directory, bucket or prefix) and registers
// its own cleanup with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) cloud.Store) {
	t.Run("PutGet", func(t *testing.T) { testPutGet(t, newStore(t)) })
	t.Run("RangedGet", func(t *testing.T) { testRangedGet(t, newStore(t)) })
	t.Run("Stat", func(t *testing.T) { testStat(t, newStore(t)) })
	t.Run("NotExist", func(t *testing.T) { testNotExist(t, newStore(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newStore(t)) })
	t.Run("List", func(t *testing.T) { testList(t, newStore(t)) })
	t.Run("ListManyKeys", func(t *testing.T) { testListMany(t, newStore(t)) })
	t.Run("OddKeys", func(t *testing.T) { testOddKeys(t, newStore(t)) })
	t.Run("Large", func(t *testing.T) { testLarge(t, newStore(t)) })
	t.Run("UnknownSize", func(t *testing.T) { testUnknownSize(t, newStore(t)) })
	t.Run("ConcurrentPuts", func(t *testing.T) { testConcurrent(t, newStore(t)) })
	t.Run("CancelledPut", func(t *testing.T) { testCancelled(t, newStore(t)) })
	t.Run("IfAbsent", func(t *testing.T) { testIfAbsent(t, newStore(t)) })
	t.Run("IfVersion", func(t *testing.T) { testIfVersion(t, newStore(t)) })
	t.Run("Download", func(t *testing.T) { testDownload(t, newStore(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// Random returns n deterministic pseudo-random bytes.
func Random(seed uint64, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)}).Read(b)
	return b
}

func put(t *testing.T, st cloud.Store, key string, data []byte) {
	t.Helper()
	if err := st.Put(ctx(t), key, bytes.NewReader(data), int64(len(data)), cloud.PutOptions{}); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
}

func get(t *testing.T, st cloud.Store, key string, off, n int64) []byte {
	t.Helper()
	rc, err := st.Get(ctx(t), key, off, n)
	if err != nil {
		t.Fatalf("get %q [%d,%d): %v", key, off, n, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %q: %v", key, err)
	}
	return b
}

func equal(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes (sha256 %x), want %d bytes (sha256 %x)",
			what, len(got), sha256.Sum256(got), len(want), sha256.Sum256(want))
	}
}

func list(t *testing.T, st cloud.Store, prefix string) []cloud.ObjectInfo {
	t.Helper()
	var out []cloud.ObjectInfo
	if err := st.List(ctx(t), prefix, func(oi cloud.ObjectInfo) error {
		out = append(out, oi)
		return nil
	}); err != nil {
		t.Fatalf("list %q: %v", prefix, err)
	}
	return out
}

func keys(infos []cloud.ObjectInfo) []string {
	out := make([]string, len(infos))
	for i, oi := range infos {
		out[i] = oi.Key
	}
	return out
}

func testPutGet(t *testing.T, st cloud.Store) {
	put(t, st, "a/b.txt", []byte("hello"))
	equal(t, "first", get(t, st, "a/b.txt", 0, -1), []byte("hello"))
	put(t, st, "a/b.txt", []byte("replaced, longer"))
	equal(t, "overwrite", get(t, st, "a/b.txt", 0, -1), []byte("replaced, longer"))
	put(t, st, "empty", nil)
	equal(t, "empty", get(t, st, "empty", 0, -1), nil)
	if got := st.URI("a/b.txt"); !strings.HasSuffix(got, "/a/b.txt") || !strings.Contains(got, "://") {
		t.Fatalf("URI=%q, want scheme://.../a/b.txt", got)
	}
}

func testRangedGet(t *testing.T, st cloud.Store) {
	data := Random(1, 1000)
	put(t, st, "r", data)
	equal(t, "[10,110)", get(t, st, "r", 10, 100), data[10:110])
	equal(t, "[990,end)", get(t, st, "r", 990, -1), data[990:])
	equal(t, "[0,1)", get(t, st, "r", 0, 1), data[:1])
	equal(t, "[900,+200) clipped", get(t, st, "r", 900, 200), data[900:])
}

func testStat(t *testing.T, st cloud.Store) {
	before := time.Now().Add(-time.Hour)
	put(t, st, "s/obj", []byte("12345"))
	oi, err := st.Stat(ctx(t), "s/obj")
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	if oi.Key != "s/obj" || oi.Size != 5 || oi.Version == "" || oi.Modified.Before(before) {
		t.Fatalf("stat=%+v, want key s/obj, size 5, a version, a recent time", oi)
	}
	put(t, st, "s/obj", []byte("12345"))
	oi2, err := st.Stat(ctx(t), "s/obj")
	if err != nil {
		t.Fatalf("stat again: %v", err)
	}
	if oi2.Size != 5 {
		t.Fatalf("size=%d after rewrite, want 5", oi2.Size)
	}
	if _, err := st.Stat(ctx(t), "s"); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat of a key prefix: err=%v, want ErrNotExist", err)
	}
}

func testNotExist(t *testing.T, st cloud.Store) {
	if _, err := st.Get(ctx(t), "missing/x", 0, -1); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("get missing: err=%v, want ErrNotExist", err)
	}
	if _, err := st.Get(ctx(t), "missing/x", 5, 10); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("ranged get missing: err=%v, want ErrNotExist", err)
	}
	if _, err := st.Stat(ctx(t), "missing/x"); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat missing: err=%v, want ErrNotExist", err)
	}
	if err := st.Delete(ctx(t), "missing/x"); err != nil {
		t.Fatalf("delete missing: %v, want nil", err)
	}
	if got := list(t, st, "missing/"); len(got) != 0 {
		t.Fatalf("list of nothing: %v", keys(got))
	}
}

func testDelete(t *testing.T, st cloud.Store) {
	put(t, st, "d/one", []byte("1"))
	put(t, st, "d/two", []byte("2"))
	if err := st.Delete(ctx(t), "d/one"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := st.Delete(ctx(t), "d/one"); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := st.Stat(ctx(t), "d/one"); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat deleted: err=%v, want ErrNotExist", err)
	}
	if got, want := keys(list(t, st, "d/")), []string{"d/two"}; !slices.Equal(got, want) {
		t.Fatalf("list=%v, want %v", got, want)
	}
	if err := st.Delete(ctx(t), "d/two"); err != nil {
		t.Fatalf("delete last: %v", err)
	}
	put(t, st, "d/three", []byte("3")) // the "directory" is still usable
	equal(t, "after delete", get(t, st, "d/three", 0, -1), []byte("3"))
}

func testList(t *testing.T, st cloud.Store) {
	// "a-c" sorts before "a/b" ('-' < '/'): a directory walk that visits
	// "a" before "a-c" would get the order wrong. (No key is both an object
	// and a prefix of another: a file store cannot hold "a/b" and "a/b/c".)
	all := []string{"a-c", "a/b", "a/c", "a0", "ab/x", "b", "checkpoints/000000000010-x/f", "checkpoints/000000000010-x/manifest.json", "checkpoints/000000000009-y/f"}
	for i, k := range all {
		put(t, st, k, Random(uint64(i), i+1))
	}
	slices.Sort(all)
	got := list(t, st, "")
	if !slices.Equal(keys(got), all) {
		t.Fatalf("list all=%v, want %v", keys(got), all)
	}
	for _, oi := range got {
		if want := int64(slices.Index(all, oi.Key)); oi.Size <= 0 || oi.Version == "" {
			t.Fatalf("list entry %+v (index %d): want size and version", oi, want)
		}
	}
	for prefix, want := range map[string][]string{
		"a/":                          {"a/b", "a/c"},
		"a":                           {"a-c", "a/b", "a/c", "a0", "ab/x"},
		"checkpoints/00000000001":     {"checkpoints/000000000010-x/f", "checkpoints/000000000010-x/manifest.json"},
		"checkpoints/000000000010-x/": {"checkpoints/000000000010-x/f", "checkpoints/000000000010-x/manifest.json"},
		"zzz":                         nil,
	} {
		if got := keys(list(t, st, prefix)); !slices.Equal(got, want) {
			t.Fatalf("list %q=%v, want %v", prefix, got, want)
		}
	}
	stop := errors.New("stop")
	n := 0
	err := st.List(ctx(t), "", func(cloud.ObjectInfo) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("list with failing fn: err=%v after %d calls, want stop after 1", err, n)
	}
}

func testListMany(t *testing.T, st cloud.Store) {
	const n = 1100 // > 1000, the page size of S3 and GCS listings
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("many/%05d", i)
	}
	parallel(t, 16, n, func(i int) error {
		return st.Put(ctx(t), want[i], strings.NewReader("x"), 1, cloud.PutOptions{})
	})
	put(t, st, "other", []byte("y"))
	if got := keys(list(t, st, "many/")); !slices.Equal(got, want) {
		t.Fatalf("list: %d keys, want %d in order (first differing near %d)", len(got), n, firstDiff(got, want))
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// parallel runs fn(0..n-1) on workers goroutines and fails on the first error.
func parallel(t *testing.T, workers, n int, fn func(i int) error) {
	t.Helper()
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	func() {
		defer close(next)
		for i := range n {
			select {
			case next <- i:
			case err := <-errs:
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

func testOddKeys(t *testing.T, st cloud.Store) {
	odd := []string{"with space/file name.bin", "ünïcödé/日本語.pt", "plus+and%percent/a&b=c?.txt", "tab\tand'quote\".x"}
	for _, k := range odd {
		put(t, st, k, []byte(k))
		equal(t, k, get(t, st, k, 0, -1), []byte(k))
		if oi, err := st.Stat(ctx(t), k); err != nil || oi.Size != int64(len(k)) {
			t.Fatalf("stat %q: %+v, %v", k, oi, err)
		}
	}
	want := slices.Clone(odd)
	slices.Sort(want)
	if got := keys(list(t, st, "")); !slices.Equal(got, want) {
		t.Fatalf("list=%q, want %q", got, want)
	}
	if got := keys(list(t, st, "with space/")); len(got) != 1 {
		t.Fatalf("list with a space in the prefix=%q", got)
	}
	for _, k := range odd {
		if err := st.Delete(ctx(t), k); err != nil {
			t.Fatalf("delete %q: %v", k, err)
		}
	}
	if got := list(t, st, ""); len(got) != 0 {
		t.Fatalf("after deletes: %q", keys(got))
	}
}

const largeSize = 64 << 20

func testLarge(t *testing.T, st cloud.Store) {
	data := Random(64, largeSize)
	put(t, st, "big/model.pt", data)
	oi, err := st.Stat(ctx(t), "big/model.pt")
	if err != nil || oi.Size != largeSize {
		t.Fatalf("stat: %+v, %v; want size %d", oi, err, largeSize)
	}
	equal(t, "64 MiB", get(t, st, "big/model.pt", 0, -1), data)
	off := int64(largeSize/2 - 3)
	equal(t, "range across the middle", get(t, st, "big/model.pt", off, 1<<20), data[off:off+1<<20])
}

func testUnknownSize(t *testing.T, st cloud.Store) {
	data := Random(7, 20<<20+17)
	// A plain io.Reader (no Len, no Seek), size -1.
	r := struct{ io.Reader }{bytes.NewReader(data)}
	if err := st.Put(ctx(t), "unknown", r, -1, cloud.PutOptions{}); err != nil {
		t.Fatalf("put size -1: %v", err)
	}
	equal(t, "size -1", get(t, st, "unknown", 0, -1), data)
	small := []byte("tiny")
	if err := st.Put(ctx(t), "unknown-small", struct{ io.Reader }{bytes.NewReader(small)}, -1, cloud.PutOptions{}); err != nil {
		t.Fatalf("put small size -1: %v", err)
	}
	equal(t, "small size -1", get(t, st, "unknown-small", 0, -1), small)
}

func testConcurrent(t *testing.T, st cloud.Store) {
	const n = 8
	contents := make([][]byte, n)
	for i := range contents {
		contents[i] = Random(uint64(100+i), 3<<20+i)
	}
	parallel(t, n, 2*n, func(i int) error {
		if i < n { // distinct keys
			return st.Put(ctx(t), fmt.Sprintf("c/%d", i), bytes.NewReader(contents[i]), int64(len(contents[i])), cloud.PutOptions{})
		}
		b := contents[i-n] // everyone writes the same key
		return st.Put(ctx(t), "c/same", bytes.NewReader(b), int64(len(b)), cloud.PutOptions{})
	})
	for i := range n {
		equal(t, fmt.Sprintf("c/%d", i), get(t, st, fmt.Sprintf("c/%d", i), 0, -1), contents[i])
	}
	same := get(t, st, "c/same", 0, -1)
	if !slices.ContainsFunc(contents, func(b []byte) bool { return bytes.Equal(b, same) }) {
		t.Fatalf("c/same holds %d bytes that no single writer wrote", len(same))
	}
}

// stallReader hands out head bytes, then signals stalled and blocks until
// release is closed, then keeps handing out bytes up to limit as a reader
// that ignores the context would.
type stallReader struct {
	data    []byte
	head    int
	pos     int
	stalled chan struct{}
	release <-chan struct{}
	once    sync.Once
}

func (r *stallReader) Read(p []byte) (int, error) {
	if r.pos >= r.head {
		r.once.Do(func() { close(r.stalled) })
		<-r.release
	}
	if r.pos >= len(r.data) {
		return 0, io.EOF
	}
	end := len(r.data)
	if r.pos < r.head {
		end = r.head
	}
	n := copy(p, r.data[r.pos:end])
	r.pos += n
	return n, nil
}

func testCancelled(t *testing.T, st cloud.Store) {
	for _, size := range []int64{40 << 20, -1} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			c, cancel := context.WithCancel(ctx(t))
			defer cancel()
			r := &stallReader{data: Random(9, 40<<20), head: 24 << 20, stalled: make(chan struct{}), release: c.Done()}
			done := make(chan error, 1)
			go func() { done <- st.Put(c, "cancelled/obj", r, size, cloud.PutOptions{}) }()
			select {
			case <-r.stalled:
			case err := <-done:
				t.Fatalf("put returned before the reader stalled: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("reader never stalled")
			}
			cancel()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("cancelled put returned nil")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("put did not return within 30s of cancellation")
			}
			if _, err := st.Stat(ctx(t), "cancelled/obj"); !errors.Is(err, cloud.ErrNotExist) {
				t.Fatalf("stat after cancelled put: err=%v, want ErrNotExist", err)
			}
			if got := list(t, st, ""); len(got) != 0 {
				t.Fatalf("objects after cancelled put: %q", keys(got))
			}
			if cl, ok := st.(cloud.Cleaner); ok {
				n, err := cl.Cleanup(ctx(t))
				if err != nil || n != 0 {
					t.Fatalf("cleanup after cancelled put found %d leftovers (err %v), want 0", n, err)
				}
			}
		})
	}
}

func testIfAbsent(t *testing.T, st cloud.Store) {
	c := ctx(t)
	if err := st.Put(c, "m/manifest.json", strings.NewReader("first"), 5, cloud.PutOptions{IfAbsent: true}); err != nil {
		t.Fatalf("IfAbsent on a new key: %v", err)
	}
	err := st.Put(c, "m/manifest.json", strings.NewReader("second"), 6, cloud.PutOptions{IfAbsent: true})
	if !errors.Is(err, cloud.ErrPrecondition) {
		t.Fatalf("IfAbsent on an existing key: err=%v, want ErrPrecondition", err)
	}
	equal(t, "after a lost IfAbsent", get(t, st, "m/manifest.json", 0, -1), []byte("first"))

	// Many writers race for one key: exactly one wins.
	var mu sync.Mutex
	wins := 0
	parallel(t, 8, 8, func(i int) error {
		err := st.Put(c, "m/race", strings.NewReader(fmt.Sprint(i)), 1, cloud.PutOptions{IfAbsent: true})
		if errors.Is(err, cloud.ErrPrecondition) {
			return nil
		}
		mu.Lock()
		wins++
		mu.Unlock()
		return err
	})
	if wins != 1 {
		t.Fatalf("%d of 8 racing IfAbsent writers won, want 1", wins)
	}
}

func testIfVersion(t *testing.T, st cloud.Store) {
	c := ctx(t)
	err := st.Put(c, "v/latest.json", strings.NewReader("x"), 1, cloud.PutOptions{IfVersion: "no-such-version"})
	if !errors.Is(err, cloud.ErrPrecondition) {
		t.Fatalf("IfVersion on a missing key: err=%v, want ErrPrecondition", err)
	}
	put(t, st, "v/latest.json", []byte("one"))
	v1, err := st.Stat(c, "v/latest.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(c, "v/latest.json", strings.NewReader("two"), 3, cloud.PutOptions{IfVersion: v1.Version}); err != nil {
		t.Fatalf("IfVersion with the current version: %v", err)
	}
	err = st.Put(c, "v/latest.json", strings.NewReader("three"), 5, cloud.PutOptions{IfVersion: v1.Version})
	if !errors.Is(err, cloud.ErrPrecondition) {
		t.Fatalf("IfVersion with a stale version: err=%v, want ErrPrecondition", err)
	}
	equal(t, "after a lost IfVersion", get(t, st, "v/latest.json", 0, -1), []byte("two"))
	var listed string
	_ = st.List(c, "v/", func(oi cloud.ObjectInfo) error { listed = oi.Version; return nil })
	if err := st.Put(c, "v/latest.json", strings.NewReader("four"), 4, cloud.PutOptions{IfVersion: listed}); err != nil {
		t.Fatalf("IfVersion with the version List reported: %v", err)
	}
}

// memWriterAt is an io.WriterAt over a fixed buffer.
type memWriterAt []byte

func (m memWriterAt) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > int64(len(m)) {
		return 0, fmt.Errorf("write past end: %d+%d > %d", off, len(p), len(m))
	}
	return copy(m[off:], p), nil
}

func testDownload(t *testing.T, st cloud.Store) {
	data := Random(33, 21<<20+5)
	put(t, st, "dl/big", data)
	var mu sync.Mutex
	var progressed int64
	buf := make(memWriterAt, len(data))
	err := cloud.Download(ctx(t), st, "dl/big", int64(len(data)), buf, cloud.DownloadOptions{
		ChunkSize: 4 << 20, Concurrency: 4,
		Progress: func(n int64) { mu.Lock(); progressed += n; mu.Unlock() },
	})
	if err != nil {
		t.Fatalf("download: %v", err)
	}
	equal(t, "download", buf, data)
	if progressed != int64(len(data)) {
		t.Fatalf("progress reported %d bytes, want %d", progressed, len(data))
	}
	small := make(memWriterAt, 3)
	put(t, st, "dl/small", []byte("abc"))
	if err := cloud.Download(ctx(t), st, "dl/small", 3, small, cloud.DownloadOptions{}); err != nil {
		t.Fatalf("download small: %v", err)
	}
	equal(t, "download small", small, []byte("abc"))
	err = cloud.Download(ctx(t), st, "dl/missing", 10, make(memWriterAt, 10), cloud.DownloadOptions{})
	if !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("download missing: err=%v, want ErrNotExist", err)
	}
}
