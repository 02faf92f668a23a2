package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errFlaky = errors.New("flaky")

func fast() Backoff { return Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond} }

func TestDo_RetriesUntilSuccess(t *testing.T) {
	n := 0
	err := Do(t.Context(), Policy{Attempts: 5, Backoff: fast()}, func(context.Context) error {
		if n++; n < 3 {
			return errFlaky
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("err=%v after %d calls, want nil after 3", err, n)
	}
}

func TestDo_StopsAtAttempts(t *testing.T) {
	n, retries := 0, 0
	p := Policy{Attempts: 4, Backoff: fast(), OnRetry: func(int, time.Duration, error) { retries++ }}
	err := Do(t.Context(), p, func(context.Context) error { n++; return errFlaky })
	if !errors.Is(err, errFlaky) || n != 4 || retries != 3 {
		t.Fatalf("err=%v, %d calls, %d retries; want errFlaky, 4, 3", err, n, retries)
	}
}

func TestDo_NotRetryable(t *testing.T) {
	permanent := errors.New("permanent")
	n := 0
	p := Policy{Attempts: 10, Backoff: fast(), Retryable: func(err error) bool { return !errors.Is(err, permanent) }}
	err := Do(t.Context(), p, func(context.Context) error { n++; return permanent })
	if !errors.Is(err, permanent) || n != 1 {
		t.Fatalf("err=%v after %d calls, want permanent after 1", err, n)
	}
}

// A cancellation while Do waits ends it at once with the context's error,
// and fn is not called again.
func TestDo_StopsAtCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	n := 0
	done := make(chan error, 1)
	waiting := make(chan struct{})
	p := Policy{Attempts: 100, Backoff: Backoff{Min: time.Hour, Max: time.Hour},
		OnRetry: func(int, time.Duration, error) { close(waiting) }}
	go func() { done <- Do(ctx, p, func(context.Context) error { n++; return errFlaky }) }()
	<-waiting
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || n != 1 {
			t.Fatalf("err=%v after %d calls, want context.Canceled after 1", err, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do kept waiting after its context was cancelled")
	}
	if err := Do(ctx, p, func(context.Context) error { n++; return nil }); !errors.Is(err, context.Canceled) || n != 1 {
		t.Fatalf("Do with a cancelled context: err=%v, fn called %d times; want Canceled, not called", err, n-1)
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for i, want := range []time.Duration{10, 20, 40, 80, 80} {
		want *= time.Millisecond
		if d := b.Next(); d < want/2 || d > want {
			t.Fatalf("delay %d = %s, want in [%s, %s]", i, d, want/2, want)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %s, want ≤ 10ms", d)
	}
}

// TestBackoff_Capped: a capped backoff never waits longer than its cap,
// and the original keeps its bounds.
func TestBackoff_Capped(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 5 * time.Second}
	c := b.Capped(40 * time.Millisecond)
	for i := 0; i < 8; i++ {
		if d := c.Next(); d > 40*time.Millisecond {
			t.Fatalf("capped delay %d = %s, want ≤ 40ms", i, d)
		}
	}
	if b.Max != 5*time.Second || b.Min != 10*time.Millisecond {
		t.Fatalf("original changed to %s..%s", b.Min, b.Max)
	}
	if c := b.Capped(time.Millisecond); c.Min != time.Millisecond || c.Max != time.Millisecond {
		t.Fatalf("cap below Min: %s..%s, want 1ms..1ms", c.Min, c.Max)
	}
	// The zero value (100 ms .. 5 s) is capped too: its zero Max was kept,
	// and Next then waited its default 5 s (GCS's single-request upload).
	z := Backoff{}.Capped(2 * time.Second)
	for i := 0; i < 8; i++ {
		if d := z.Next(); d > 2*time.Second {
			t.Fatalf("capped zero backoff: delay %d = %s, want ≤ 2s", i, d)
		}
	}
}
