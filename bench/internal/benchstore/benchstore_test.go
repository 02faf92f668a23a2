package benchstore

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestCounted: each request counted (a List as one), the bytes written
// and read, and Reset zeroes them.
func TestCounted(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &Counted{Store: fs}
	for _, k := range []string{"a", "b"} {
		if err := c.Put(ctx, k, bytes.NewReader([]byte("hello")), 5, cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := c.Get(ctx, "a", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if _, err := c.Stat(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	n := 0
	c.List(ctx, "", func(cloud.ObjectInfo) error { n++; return nil })
	c.Delete(ctx, "a")
	if string(b) != "ell" || n != 2 || c.Requests.Load() != 6 || c.Written.Load() != 10 || c.Read.Load() != 3 {
		t.Fatalf("read %q, listed %d; counted %d requests, %d written, %d read; want 6, 10, 3",
			b, n, c.Requests.Load(), c.Written.Load(), c.Read.Load())
	}
	c.Reset()
	if c.Requests.Load()+c.Written.Load()+c.Read.Load() != 0 {
		t.Fatal("Reset left counts")
	}
}

// TestWaitHTTP: waits through a 503 to the 200; gives up with the status
// past its timeout.
func TestWaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 || r.URL.Path == "/down" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := WaitHTTP(srv.URL+"/up", 30*time.Second); err != nil || calls.Load() < 3 {
		t.Fatalf("WaitHTTP: %v after %d calls", err, calls.Load())
	}
	if err := WaitHTTP(srv.URL+"/down", 300*time.Millisecond); err == nil {
		t.Fatal("a server that stays down: want an error")
	}
	if a, err := FreePort(); err != nil || a == "" {
		t.Fatalf("FreePort: %q, %v", a, err)
	}
}

// TestClose_RemovesData: a MinIO that failed to start (no binary) leaves
// its data directory behind until Close, which removes it.
func TestClose_RemovesData(t *testing.T) {
	work := t.TempDir()
	s := New(filepath.Join(work, "no-minio"), work)
	data := filepath.Join(work, "data-x")
	if _, err := s.StartMinIOIn("x", data); err == nil {
		t.Fatal("StartMinIOIn without a binary: want an error")
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("data directory before Close: %v", err)
	}
	if _, err := s.OnDisk(); err == nil {
		t.Fatal("OnDisk without a binary: want an error")
	}
	s.Close()
	for _, d := range []string{data, filepath.Join(work, "minio-disk")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s after Close: %v, want gone", d, err)
		}
	}
}
