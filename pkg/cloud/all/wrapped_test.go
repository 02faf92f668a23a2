package all_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/azuritetest"
	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/azblob"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
	"github.com/spotagent/spotagent/pkg/cloud/wrap"
)

// openWrapped opens uri through all.Open (the wrapped store every command
// gets), emptied and closed at the end.
func openWrapped(t *testing.T, uri string, opts all.Options) cloud.Store {
	t.Helper()
	st, err := all.Open(t.Context(), uri, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cloudtest.Empty(t, st)
		st.Close()
	})
	return st
}

// The conformance suite against the stores all.Open returns: the plain
// backends' packages run it against the plain stores.
func TestConformance_Wrapped(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		cloudtest.Run(t, func(t *testing.T) cloud.Store { return openWrapped(t, t.TempDir(), all.Options{}) })
	})
	t.Run("s3", func(t *testing.T) {
		_, bucket := s3test.NewServer(t)
		cloudtest.Run(t, func(t *testing.T) cloud.Store {
			return openWrapped(t, "s3://"+bucket+"/"+cloudtest.Prefix(), all.Options{S3PartSize: 5 << 20, S3Concurrency: 4})
		})
	})
	t.Run("gcs", func(t *testing.T) {
		_, bucket := gcstest.NewServer(t)
		cloudtest.Run(t, func(t *testing.T) cloud.Store {
			return openWrapped(t, "gs://"+bucket+"/"+cloudtest.Prefix(), all.Options{GCSChunkSize: 8 << 20})
		})
	})
	t.Run("azure", func(t *testing.T) {
		azuritetest.NewServer(t) // AZURE_STORAGE_CONNECTION_STRING: a shared key, no credential chain
		cloudtest.Run(t, func(t *testing.T) cloud.Store {
			return openWrapped(t, "az://"+azuritetest.Container+"/"+cloudtest.Prefix(), all.Options{AzureBlockSize: 4 << 20, AzureConcurrency: 4})
		})
	})
}

// TestOpen_AzureRetries: through all.Open, an az:// Stat answered 503
// twice is retried by the wrapper (one request per attempt) and succeeds;
// a missing container fails the open at once, naming it.
func TestOpen_AzureRetries(t *testing.T) {
	srv := azuritetest.NewServer(t)
	proxy := faultproxy.New(t, srv.URL)
	t.Setenv("AZURE_STORAGE_ENDPOINT", proxy.URL+"/"+azuritetest.Account)
	st := openWrapped(t, "az://"+azuritetest.Container+"@"+azuritetest.Account+"/retries", all.Options{
		Retry: wrap.RetryOptions{MinWait: time.Millisecond, MaxWait: 10 * time.Millisecond}})
	if _, ok := cloudtest.Plain(st).(*azblob.Store); !ok {
		t.Fatalf("cloudtest.Plain(%T) is not the Azure backend", st)
	}
	ctx := t.Context()
	if err := st.Put(ctx, "k", strings.NewReader("v"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	isHead := func(r *http.Request) bool { return r.Method == http.MethodHead }
	proxy.Set(faultproxy.Fault{Mode: faultproxy.SlowDown, Count: 2, Match: isHead})
	before := proxy.Stats()
	if _, err := st.Stat(ctx, "k"); err != nil {
		t.Fatalf("stat through two 503s: %v", err)
	}
	if got := proxy.Stats().Requests - before.Requests; got != 3 {
		t.Fatalf("%d requests, want 3 (one per attempt: no retry below the wrapper)", got)
	}
	proxy.Clear()
	_, err := all.Open(ctx, "az://no-such-container/x", all.Options{})
	if !errors.Is(err, cloud.ErrBucketNotFound) || !strings.Contains(err.Error(), "no-such-container") {
		t.Fatalf("open of a missing container: %v", err)
	}
}

// attempts counts the store operations all.Open's Observer sees (each
// attempt, below the retries).
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) StoreOp(op, result string, _ time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[op+" "+result]++
}

func (a *attempts) get(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

// TestOpen_Retries, on S3 through the fault proxy: a Stat answered 500
// twice is retried by the wrapper and succeeds on the third attempt (one
// request each: the backend makes one attempt); a missing object and a
// lost if-absent write are not retried.
func TestOpen_Retries(t *testing.T) {
	srv := s3test.New(t)
	proxy := faultproxy.New(t, srv.Endpoint)
	obs := &attempts{}
	st := openWrapped(t, "s3://"+srv.Bucket+"/retries", all.Options{S3Endpoint: proxy.URL, Observer: obs,
		Retry: wrap.RetryOptions{MinWait: time.Millisecond, MaxWait: 10 * time.Millisecond}})
	if _, ok := cloudtest.Plain(st).(*s3.Store); !ok {
		t.Fatalf("cloudtest.Plain(%T) is not the S3 backend", st)
	}
	ctx := t.Context()
	if err := st.Put(ctx, "k", strings.NewReader("v"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	isHead := func(r *http.Request) bool { return r.Method == http.MethodHead }
	proxy.Set(faultproxy.Fault{Mode: faultproxy.InternalError, Count: 2, Match: isHead})
	before := proxy.Stats()
	if _, err := st.Stat(ctx, "k"); err != nil {
		t.Fatalf("stat through two 500s: %v", err)
	}
	if got := proxy.Stats().Requests - before.Requests; got != 3 {
		t.Fatalf("%d requests, want 3 (one per attempt: no retry below the wrapper)", got)
	}
	if got, want := obs.get("stat error"), 2; got != want {
		t.Fatalf("failed stat attempts=%d, want %d", got, want)
	}
	proxy.Clear()

	before = proxy.Stats()
	if _, err := st.Stat(ctx, "missing"); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat missing: %v", err)
	}
	err := st.Put(ctx, "k", bytes.NewReader([]byte("w")), 1, cloud.PutOptions{IfAbsent: true})
	if !errors.Is(err, cloud.ErrPrecondition) {
		t.Fatalf("if-absent put of an existing key: %v", err)
	}
	if got := proxy.Stats().Requests - before.Requests; got != 2 {
		t.Fatalf("%d requests for a missing stat and a lost if-absent put, want 2 (no retries)", got)
	}
	if obs.get("stat not_found") != 1 || obs.get("put precondition") != 1 {
		t.Fatalf("observed %v", obs.n)
	}
}
