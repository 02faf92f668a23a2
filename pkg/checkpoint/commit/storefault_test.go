package commit

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// faultStore is a real S3 or GCS store (the in-process fakes) reached
// through a fault proxy, and the same store reached directly, to check
// what landed.
type faultStore struct {
	proxy          *faultproxy.Proxy
	faulty, direct cloud.Store
}

// openFaultStore starts backend's server and proxy and opens both stores,
// all closed at the end of the test. Not for a parallel test: the GCS
// library reads STORAGE_EMULATOR_HOST when its client is made (t.Setenv),
// and the clients keep their host once made.
func openFaultStore(t *testing.T, backend string) *faultStore {
	t.Helper()
	open := func(uri string, opts all.Options) cloud.Store {
		st, err := all.Open(t.Context(), uri, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	fst := &faultStore{}
	switch backend {
	case "s3":
		srv := s3test.New(t) // its credentials in the environment (t.Setenv)
		fst.proxy = faultproxy.New(t, srv.Endpoint)
		uri := "s3://" + srv.Bucket + "/retries"
		fst.faulty = open(uri, all.Options{S3Endpoint: fst.proxy.URL, S3PartSize: 5 << 20})
		fst.direct = open(uri, all.Options{S3Endpoint: srv.Endpoint})
	case "gcs":
		srv, err := gcstest.Start("spotagent-test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		fst.proxy = faultproxy.New(t, "http://"+srv.Host)
		uri := "gs://" + srv.Bucket + "/retries"
		t.Setenv("STORAGE_EMULATOR_HOST", fst.proxy.Host)
		fst.faulty = open(uri, all.Options{GCSChunkSize: 1 << 20})
		t.Setenv("STORAGE_EMULATOR_HOST", srv.Host)
		fst.direct = open(uri, all.Options{})
	default:
		t.Fatalf("backend %q", backend)
	}
	return fst
}

// isWrite matches requests that carry object data.
func isWrite(r *http.Request) bool { return r.Method == http.MethodPut || r.Method == http.MethodPost }

// isCreate matches a conditional create (manifest.json, the first
// latest.json): S3 If-None-Match: *, GCS ifGenerationMatch=0.
func isCreate(r *http.Request) bool {
	return r.Header.Get("If-None-Match") == "*" || r.URL.Query().Get("ifGenerationMatch") == "0"
}

// TestStoreFault_CommitRetries commits through each fault, on S3 and GCS:
// the commit must complete (the backends retry with backoff), the fault
// must have been injected, and what landed restores and verifies byte for
// byte from the store reached directly. (End to end in integration until
// #49: it never needed the binary.)
func TestStoreFault_CommitRetries(t *testing.T) {
	faults := []faultproxy.Fault{
		{Mode: faultproxy.SlowDown, Count: 2, Match: isWrite},
		{Mode: faultproxy.InternalError, Count: 1, Match: isWrite},
		{Mode: faultproxy.ResetRequest, After: 256 << 10, Count: 1, Match: isWrite},
		{Mode: faultproxy.ResetResponse, After: 0, Count: 1, Match: isWrite},
		// The answer to the manifest's create-if-absent is lost: the retry
		// finds the object there. The commit must still succeed.
		{Mode: faultproxy.ResetResponse, After: 0, Count: 1, Match: isCreate},
		{Mode: faultproxy.Stall, Stall: 1500 * time.Millisecond, Count: 1, Match: isWrite},
		{Mode: faultproxy.Slow, Rate: 4 << 20},
	}
	// Both stores are opened here, one after the other (the GCS clients
	// read STORAGE_EMULATOR_HOST as they are made); then the two backends
	// run side by side, each its own server, proxy and committer.
	stores := map[string]*faultStore{"s3": openFaultStore(t, "s3"), "gcs": openFaultStore(t, "gcs")}
	for _, backend := range []string{"s3", "gcs"} {
		fst := stores[backend]
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			c := &Committer{Store: fst.faulty, RunID: "faults", Log: zaptest.NewLogger(t)}
			ctx := context.Background()
			for i, f := range faults {
				name := fmt.Sprintf("%d-%s", i, f.Mode)
				if i == 4 {
					name += "-create"
				}
				t.Run(name, func(t *testing.T) {
					id, step := fmt.Sprintf("f%d", i), int64(100+i)
					dir := filepath.Join(t.TempDir(), id)
					if err := writeFaultCheckpoint(dir, id, step); err != nil {
						t.Fatal(err)
					}
					before := fst.proxy.Stats().Faults
					fst.proxy.Set(f)
					defer fst.proxy.Clear()
					start := time.Now()
					cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
					defer cancel()
					if _, err := c.Commit(cctx, Request{Dir: dir, ID: id, Step: step, Reason: "periodic"}); err != nil {
						t.Fatalf("commit through %s: %v", f.Mode, err)
					}
					injected := fst.proxy.Stats().Faults - before
					if want := int64(max(f.Count, 1)); injected < want {
						t.Fatalf("%d faults injected, want at least %d: the fault never hit the commit", injected, want)
					}
					if f.Mode == faultproxy.Stall && time.Since(start) < f.Stall {
						t.Fatalf("commit took %s through a %s stall", time.Since(start), f.Stall)
					}
					fst.proxy.Clear()
					r, err := restore.Checkpoint(ctx, fst.direct, t.TempDir(), restore.Options{})
					if err != nil {
						t.Fatal(err)
					}
					if r.Manifest.ID != id || len(r.Skipped) > 0 {
						t.Fatalf("restored %s (skipped %v), want %s through latest.json", r.Manifest.ID, r.Skipped, id)
					}
					if err := checkFaultRestore(r.Dir, id, step); err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
}

// faultCheckpointFiles is the content of checkpoint (id, step), made again
// to check a restore byte for byte; the crash victim (victim_test.go)
// writes the same. One file in three is large enough for a multipart
// upload (5 MiB parts).
func faultCheckpointFiles(id string, step int64) map[string][]byte {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(step)))
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], rng.Uint64())
	binary.LittleEndian.PutUint64(seed[8:], rng.Uint64())
	src := rand.NewChaCha8(seed)
	files := map[string][]byte{}
	n := 1 + rng.IntN(4)
	for i := range n {
		size := rng.IntN(64 << 10)
		if i == 0 && rng.IntN(3) == 0 {
			size = 5<<20 + rng.IntN(3<<20)
		}
		b := make([]byte, size)
		src.Read(b)
		name := fmt.Sprintf("f%d.bin", i)
		if i == 2 {
			name = "sub/opt.bin"
		}
		files[name] = b
	}
	files["step.json"] = []byte(fmt.Sprintf(`{"id":%q,"step":%d}`, id, step))
	return files
}

func writeFaultCheckpoint(dir, id string, step int64) error {
	for name, b := range faultCheckpointFiles(id, step) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// checkFaultRestore compares a restored directory with checkpoint (id,
// step): the same names, the same bytes, nothing else.
func checkFaultRestore(dir, id string, step int64) error {
	want := faultCheckpointFiles(id, step)
	got := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		got[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		return err
	}
	if len(got) != len(want) {
		return fmt.Errorf("restored %d files, the checkpoint had %d", len(got), len(want))
	}
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			return fmt.Errorf("%s: restored %d bytes differ from the %d written", name, len(got[name]), len(b))
		}
	}
	return nil
}
