package integration

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// silenceArgs: the hostile tests' flags (JSON logs, a file store, the
// agent's own socket) with a 3 s periodic interval.
func silenceArgs(dir string, extra ...string) []string {
	args := hostileArgs(dir, append([]string{"--term-grace", "5s"}, extra...)...)
	for i, a := range args {
		if a == "--interval" {
			args[i+1] = "3s"
		}
	}
	return args
}

// f is the float field k of a log line (0 when absent).
func (e logEntry) f(k string) float64 {
	v, _ := e[k].(float64)
	return v
}

// TestSilence_NeverConnects: a trainer that never connects is said at
// once: the agent warns when the first checkpoint falls due (within one
// interval of the start), says nothing was ever committed (never "the
// previous checkpoint stands"), and the report counts that time as
// unprotected, not goodput.
func TestSilence_NeverConnects(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	// A real trainer whose environment lost SPOTAGENT_SOCKET (as `env -u`,
	// sudo or a Kubernetes container without it do): the client is a
	// no-op, and says so on stderr.
	p := start(t, nil, append(append(silenceArgs(dir), "--"), fakeTrainer("--no-socket", "--step-time", "0.05")...)...)
	p.waitRe(`^trainer: connected .*enabled=False`, time.Minute)
	p.waitRe(`spotagent: WARNING: SPOTAGENT_RUN_ID and SPOTAGENT_CHECKPOINT_DIR set but SPOTAGENT_SOCKET is not`, time.Minute)
	w := p.waitEntry("no trainer connected: checkpoints are not being taken, and an interruption now would lose everything: nothing was ever committed", time.Minute, nil)
	// Said when the first checkpoint fell due: 3 s after the start, and
	// never later than one more interval (the loop wakes at the due time).
	if got := w.f("unprotected_s"); got < 2.5 || got > 6 {
		t.Fatalf("warned after %.1f s unprotected, want within one interval of the first checkpoint due (3 s)", got)
	}
	if w.str("socket") != filepath.Join(dir, "a.sock") || !strings.Contains(w.str("fix"), "SPOTAGENT_SOCKET") {
		t.Fatalf("warning names socket %q, fix %q: want the socket and SPOTAGENT_SOCKET", w.str("socket"), w.str("fix"))
	}
	if ever, ok := w["ever_committed"].(bool); !ok || ever {
		t.Fatalf("ever_committed=%v, want false", w["ever_committed"])
	}

	p.signal(syscall.SIGTERM)
	stop := p.waitEntry("interruption checkpoint did not commit: nothing was ever committed: a rerun starts from the beginning", time.Minute, nil)
	if _, ok := stop["committed_step"]; ok {
		t.Fatalf("the stop claims a committed step: %v", stop)
	}
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	if n := len(p.entries("interruption checkpoint did not commit: the previous checkpoint stands")); n != 0 {
		t.Fatalf("%d lines say the previous checkpoint stands: there was none", n)
	}
	if n := len(p.entries("no trainer connected: checkpoints are not being taken, and an interruption now would lose everything: nothing was ever committed")); n != 1 {
		t.Fatalf("%d warnings, want 1 (at once, then every 5 min)", n)
	}

	out, stderr, code := runReport(t, nil, "--store", "file://"+filepath.Join(dir, "store"), "--format", "json")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, stderr)
	}
	r := parseReport(t, out)
	if got := r.Seconds["productive"]; got > 0.5 {
		t.Fatalf("report: %.1f s productive, want 0 (nothing was ever protected): %v", got, r.Seconds)
	}
}

// TestSilence_NeverConnectsFinishes: a trainer that never connected and
// finished on its own (exit 0) was never protected: the report counts its
// time as unprotected, not goodput (before, 100 %).
func TestSilence_NeverConnectsFinishes(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	// Without its socket, 120 steps of 50 ms: 6 s.
	p := start(t, nil, append(append(silenceArgs(dir), "--"), fakeTrainer("--no-socket", "--step-time", "0.05", "--steps", "120")...)...)
	p.waitEntry("no trainer connected: checkpoints are not being taken, and an interruption now would lose everything: nothing was ever committed", time.Minute, nil)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0 (the trainer finished)", code)
	}
	out, stderr, code := runReport(t, nil, "--store", "file://"+filepath.Join(dir, "store"), "--format", "json")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, stderr)
	}
	r := parseReport(t, out)
	if got := r.Seconds["unprotected"]; got < 5 {
		t.Fatalf("report: %.1f s unprotected, want the trainer's 6 s: %v", got, r.Seconds)
	}
	if got := r.Seconds["productive"]; got > r.Wall-5 {
		t.Fatalf("report: %.1f s productive of %.1f s wall, want the unprotected time left out: %v", got, r.Wall, r.Seconds)
	}
}
