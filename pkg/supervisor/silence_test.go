package supervisor

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestFailureCause: the cause of a failed checkpoint is named from the
// agent's own error or from a trainer's failed text (the Python client's
// "ENOSPC: [Errno 28] ...", a bare OSError's "[Errno 13] ...", the
// strerror), and never from a word that merely contains a name.
func TestFailureCause(t *testing.T) {
	for _, c := range []struct {
		err  error
		text string
		want string
	}{
		{&os.PathError{Op: "mkdir", Path: "/x", Err: syscall.ENOSPC}, "", "ENOSPC"},
		{fmt.Errorf("commit: %w", &os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}), "", "EACCES"},
		{nil, "ENOSPC: [Errno 28] No space left on device: '/ckpt/x'", "ENOSPC"},
		{nil, "[Errno 13] Permission denied: '/ckpt/x'", "EACCES"},
		{nil, "write failed: read-only file system", "EROFS"},
		{nil, "disk quota exceeded", "EDQUOT"},
		{nil, "XENOSPCX happened", ""},
		{nil, "model too large", ""},
		{fmt.Errorf("plain"), "", ""},
	} {
		if got, fix := failureCause(c.err, c.text); got != c.want || (got != "" && fix == "") {
			t.Errorf("failureCause(%v, %q) = %q (fix %q), want %q with a fix", c.err, c.text, got, fix, c.want)
		}
	}
}

// TestSilence_NoTrainerRate: said at once when due, not again within
// warnEvery, again after it; the unprotected time runs from the last
// commit (or the start) until a trainer connects.
func TestSilence_NoTrainerRate(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var s silence
	t0 := time.Unix(1000, 0)
	v := silentView{socket: "/run/a.sock", since: t0.Add(-3 * time.Second)}
	s.noTrainer(true, t0, v, log)
	s.noTrainer(true, t0.Add(time.Minute), v, log)
	if n := logs.FilterMessageSnippet("no trainer connected").Len(); n != 1 {
		t.Fatalf("%d warnings within warnEvery, want 1", n)
	}
	if got, want := s.nextWake(nil, time.Minute), t0.Add(warnEvery); !got.Equal(want) {
		t.Fatalf("next wake %v, want %v", got, want)
	}
	s.noTrainer(true, t0.Add(warnEvery), v, log)
	if n := logs.FilterMessageSnippet("no trainer connected").Len(); n != 2 {
		t.Fatalf("%d warnings after warnEvery, want 2", n)
	}
	v.trainers = 1
	s.noTrainer(false, t0.Add(warnEvery+time.Second), v, log)
	if got, want := s.unprotectedSeconds(t0.Add(time.Hour)), (warnEvery + 4*time.Second).Seconds(); got != want {
		t.Fatalf("unprotected %v s, want %v s", got, want)
	}
	if logs.FilterMessage("a trainer connected: periodic checkpoints resume").Len() != 1 {
		t.Fatal("the trainer's return is not said")
	}
}

// TestUnansweredAfter: two intervals, at least 10 s and 4 saves.
func TestUnansweredAfter(t *testing.T) {
	for _, c := range []struct{ iv, save, want time.Duration }{
		{3 * time.Second, 0, 10 * time.Second},
		{time.Minute, time.Second, 2 * time.Minute},
		{time.Minute, time.Minute, 4 * time.Minute},
	} {
		if got := UnansweredAfter(c.iv, c.save); got != c.want {
			t.Errorf("UnansweredAfter(%s, %s) = %s, want %s", c.iv, c.save, got, c.want)
		}
	}
}
