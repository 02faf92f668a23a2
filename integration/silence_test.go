package integration

import (
	"path/filepath"
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
