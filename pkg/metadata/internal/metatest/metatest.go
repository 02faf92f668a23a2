// Package metatest holds test helpers shared by the metadata sources' tests.
package metatest

import (
	"context"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Watch runs src.Watch in the background. The returned stop cancels it
// and fails the test unless Watch returns nil within 5 s; it is also
// registered with t.Cleanup.
func Watch(t testing.TB, src metadata.Source) (<-chan metadata.Notice, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan metadata.Notice, 64)
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx, ch) }()
	stopped := false
	stop := func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch returned %v, want nil", err)
			}
		case <-time.After(5 * time.Second): // against hanging requests of a minute
			t.Errorf("Watch still running 5s after its context ended")
		}
	}
	t.Cleanup(stop)
	return ch, stop
}

// Next returns the next notice, failing the test after timeout.
func Next(t testing.TB, ch <-chan metadata.Notice, timeout time.Duration) metadata.Notice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(timeout):
		t.Fatalf("no notice within %v", timeout)
		return metadata.Notice{}
	}
}

// NoNotice fails the test if a notice is waiting in ch.
func NoNotice(t testing.TB, ch <-chan metadata.Notice) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("unexpected notice %+v", n)
	default:
	}
}

// WaitFor polls cond every few milliseconds and fails the test if it is
// not true within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition, not synchronising
	}
}

// Counter is what the fakes offer for counting requests.
type Counter interface{ Requests() int64 }

// WaitRequests waits until f has served n more requests.
func WaitRequests(t testing.TB, f Counter, n int64) {
	t.Helper()
	start := f.Requests()
	WaitFor(t, 5*time.Second, "requests", func() bool { return f.Requests() >= start+n })
}

// WaitTotal waits until f has served n requests in all: for waits right
// after Watch starts, whose first requests may already be in.
func WaitTotal(t testing.TB, f Counter, n int64) {
	t.Helper()
	WaitFor(t, 10*time.Second, "requests", func() bool { return f.Requests() >= n })
}

// Within fails the test unless got is within tol of want.
func Within(t testing.TB, what string, got, want time.Time, tol time.Duration) {
	t.Helper()
	if d := got.Sub(want); d < -tol || d > tol {
		t.Errorf("%s=%v, want %v ± %v", what, got, want, tol)
	}
}
