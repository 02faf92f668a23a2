package wrap_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/wrap"
)

// flaky is a real file store whose Stat, Get and List first fail with the
// errors queued in fails; it counts every call.
type flaky struct {
	cloud.Store
	mu    sync.Mutex
	fails []error
	calls int
	// called, when set, receives each call's number.
	called chan int
	// listBreak makes List deliver that many objects before failing.
	listBreak int
}

func (f *flaky) next() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.called != nil {
		f.called <- f.calls
	}
	if len(f.fails) == 0 {
		return nil
	}
	err := f.fails[0]
	if !errors.Is(err, errAlways) {
		f.fails = f.fails[1:]
	}
	return err
}

var (
	errTransient = errors.New("connection reset by peer")
	errAlways    = fmt.Errorf("always: %w", errTransient)
)

func (f *flaky) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	if err := f.next(); err != nil {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return f.Store.Stat(ctx, key)
}

func (f *flaky) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := f.next(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return f.Store.Get(ctx, key, off, n)
}

func (f *flaky) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	err := f.next()
	n := 0
	lerr := f.Store.List(ctx, prefix, func(oi cloud.ObjectInfo) error {
		if err != nil && n == f.listBreak {
			return err
		}
		n++
		return fn(oi)
	})
	if err != nil && n < f.listBreak {
		return err
	}
	return lerr
}

func newFlaky(t *testing.T, fails ...error) (*flaky, cloud.Store) {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := st.Put(t.Context(), k, strings.NewReader(k), 1, cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f := &flaky{Store: st, fails: fails}
	return f, wrap.Retry(f, wrap.RetryOptions{MinWait: time.Millisecond, MaxWait: 2 * time.Millisecond})
}

func TestRetry_Transient(t *testing.T) {
	f, st := newFlaky(t, errTransient, errTransient)
	if oi, err := st.Stat(t.Context(), "a"); err != nil || oi.Size != 1 {
		t.Fatalf("stat=%+v, %v; want the object after two transient failures", oi, err)
	}
	if got, want := f.calls, 3; got != want {
		t.Fatalf("calls=%d, want %d", got, want)
	}
	f.fails = []error{errAlways}
	f.calls = 0
	if _, err := st.Get(t.Context(), "a", 0, -1); !errors.Is(err, errTransient) {
		t.Fatalf("get through a store that always fails: err=%v", err)
	}
	if got, want := f.calls, 10; got != want {
		t.Fatalf("calls=%d, want %d (the default attempts)", got, want)
	}
}

// Errors another attempt cannot cure are returned after one attempt, and
// still compare as what they are.
func TestRetry_NotRetryable(t *testing.T) {
	perm := &fs.PathError{Op: "open", Path: "/x", Err: os.ErrPermission}
	for _, err := range []error{cloud.ErrNotExist, cloud.ErrPrecondition, cloud.ErrAccessDenied,
		cloud.ErrBucketNotFound, cloud.ErrInvalidKey, perm} {
		t.Run(err.Error(), func(t *testing.T) {
			f, st := newFlaky(t, err, err, err)
			_, got := st.Stat(t.Context(), "a")
			if !errors.Is(got, err) || f.calls != 1 {
				t.Fatalf("err=%v after %d calls, want %v after 1", got, f.calls, err)
			}
		})
	}
	// A backend's own judgement (its SDK's) is asked too.
	f := &flaky{Store: must(file.New(t.TempDir())), fails: []error{errTransient, errTransient}}
	st := wrap.Retry(f, wrap.RetryOptions{MinWait: time.Millisecond, Retryable: func(err error) bool { return false }})
	if _, err := st.Stat(t.Context(), "a"); !errors.Is(err, errTransient) || f.calls != 1 {
		t.Fatalf("err=%v after %d calls, want errTransient after 1", err, f.calls)
	}
}

// The retry wrapper stops at once when its context is cancelled while it
// waits before the next attempt, with the context's error, and makes no
// further attempt; a context already done makes none at all.
func TestRetry_StopsAtCancel(t *testing.T) {
	f, _ := newFlaky(t, errAlways)
	f.called = make(chan int, 100)
	st := wrap.Retry(f, wrap.RetryOptions{MinWait: time.Hour, MaxWait: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := st.Stat(ctx, "a"); done <- err }()
	<-f.called // the first attempt failed; the wrapper now waits an hour
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err=%v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wrapper kept waiting after its context was cancelled")
	}
	if f.calls != 1 {
		t.Fatalf("%d attempts, want 1", f.calls)
	}
	if _, err := st.Get(ctx, "a", 0, -1); !errors.Is(err, context.Canceled) || f.calls != 1 {
		t.Fatalf("get with a cancelled context: err=%v, %d attempts; want Canceled, none", err, f.calls-1)
	}
	dctx, dcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer dcancel()
	if _, err := st.Stat(dctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stat past its deadline: err=%v, want DeadlineExceeded", err)
	}
}

// cloud.WithMaxWait bounds the waits of the operations made with its context:
// a store whose own waits are an hour retries within the bound, and the
// same store without it still waits its hour.
func TestRetry_WithMaxWait(t *testing.T) {
	f, _ := newFlaky(t, errTransient, errTransient)
	st := wrap.Retry(f, wrap.RetryOptions{MinWait: time.Hour, MaxWait: time.Hour})
	done := make(chan error, 1)
	go func() { _, err := st.Stat(cloud.WithMaxWait(t.Context(), time.Millisecond), "a"); done <- err }()
	select {
	case err := <-done:
		if err != nil || f.calls != 3 {
			t.Fatalf("err=%v after %d calls, want the object after 3", err, f.calls)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WithMaxWait's bound was not applied: the wrapper waits its hour")
	}
	f.fails, f.calls = []error{errTransient}, 0
	f.called = make(chan int, 10)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { _, err := st.Stat(ctx, "a"); done <- err }()
	<-f.called
	select {
	case err := <-done:
		t.Fatalf("without WithMaxWait the retry came at once (err=%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}

// A listing that breaks off is retried and resumes after the last key
// delivered: fn sees each key once, in order. fn's own error is not
// retried.
func TestRetry_ListResumes(t *testing.T) {
	f, st := newFlaky(t, errTransient)
	f.listBreak = 2
	var got []string
	if err := st.List(t.Context(), "", func(oi cloud.ObjectInfo) error { got = append(got, oi.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(got, want) || f.calls != 2 {
		t.Fatalf("listed %v in %d calls, want %v in 2", got, f.calls, want)
	}
	f.calls = 0
	stop := errors.New("stop")
	if err := st.List(t.Context(), "", func(cloud.ObjectInfo) error { return stop }); !errors.Is(err, stop) || f.calls != 1 {
		t.Fatalf("list with failing fn: err=%v after %d calls, want stop after 1", err, f.calls)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
