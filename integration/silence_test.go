package integration

import (
	"os"
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

// unconnectedTrainer is a real trainer on the client library whose
// environment lost SPOTAGENT_SOCKET (as `env -u`, sudo or a Kubernetes
// container without it do): the client is a no-op, and says so on stderr.
// With an argument it trains that many seconds and exits 0.
const unconnectedTrainer = `
import os, sys, time
os.environ.pop("SPOTAGENT_SOCKET", None)
import spotagent
agent = spotagent.connect()
print("trainer: enabled=%s" % agent.enabled, flush=True)
end = time.monotonic() + float(sys.argv[1]) if len(sys.argv) > 1 else None
step = 0
while end is None or time.monotonic() < end:
    step += 1
    time.sleep(0.05)
    agent.poll(step)
print("trainer: finished", flush=True)
`

// TestSilence_NeverConnects: a trainer that never connects is said at
// once: the agent warns when the first checkpoint falls due (within one
// interval of the start), says nothing was ever committed (never "the
// previous checkpoint stands"), and the report counts that time as
// unprotected, not goodput.
func TestSilence_NeverConnects(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	script := filepath.Join(dir, "unconnected.py")
	if err := os.WriteFile(script, []byte(unconnectedTrainer), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{"PYTHONPATH=" + filepath.Join(repo, "python")}, append(silenceArgs(dir), "--", python, script)...)
	p.waitRe(`^trainer: enabled=False`, time.Minute)
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
	script := filepath.Join(dir, "unconnected.py")
	if err := os.WriteFile(script, []byte(unconnectedTrainer), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{"PYTHONPATH=" + filepath.Join(repo, "python")}, append(silenceArgs(dir), "--", python, script, "6")...)
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

// deafTrainer connects and trains but never polls: every request goes
// unanswered.
const deafTrainer = `
import time
import spotagent
agent = spotagent.connect()
print("trainer: connected=%s" % agent.connected, flush=True)
while True:
    time.sleep(0.1)
`

// TestSilence_DeafTrainer: a trainer that never answers a periodic
// request is said within the stated bound (two intervals, at least 10 s),
// long before the request's own deadline (10 min), and the warning says
// nothing was committed.
func TestSilence_DeafTrainer(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	script := filepath.Join(dir, "deaf.py")
	if err := os.WriteFile(script, []byte(deafTrainer), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{"PYTHONPATH=" + filepath.Join(repo, "python")}, append(silenceArgs(dir), "--", python, script)...)
	req := p.waitEntry("checkpoint requested", time.Minute, nil)
	w := p.waitEntry("trainer has not answered the checkpoint request: an interruption now would lose everything: nothing was ever committed", time.Minute, nil)
	if w.str("id") != req.str("id") {
		t.Fatalf("warned of request %s, want %s", w.str("id"), req.str("id"))
	}
	// The bound is UnansweredAfter: max(2 × 3 s, 10 s, 4 × the save) = 10 s.
	if got := w.f("waited_s"); got < 10 || got > 15 {
		t.Fatalf("warned after %.1f s, want within the stated bound (10 s, and the loop's wake)", got)
	}
	if !strings.Contains(w.str("fix"), "agent.poll(step)") {
		t.Fatalf("fix %q: want it to say poll", w.str("fix"))
	}
	p.signal(syscall.SIGTERM)
	p.wait(time.Minute)
}

// fullDiskTrainer saves its first checkpoint, then meets a real ENOSPC
// (the kernel's, from /dev/full) on each later one and fails it with the
// OSError, as the example trainer does.
const fullDiskTrainer = `
import os, time
import spotagent
agent = spotagent.connect()
step, saved = 0, 0
while True:
    step += 1
    time.sleep(0.02)
    req = agent.poll(step)
    if req:
        try:
            if saved:
                with open("/dev/full", "wb", buffering=0) as f:
                    f.write(b"state")
            with open(os.path.join(req.dir, "state.txt"), "w") as f:
                f.write("step %d\n" % step)
        except OSError as e:
            req.fail(e)
            print("trainer: failed %s: %s" % (req.id, e), flush=True)
        else:
            req.done(step)
            saved += 1
    if agent.should_stop:
        break
agent.close()
`

// TestSilence_DiskFull: a checkpoint that fails on ENOSPC is logged with
// its cause named and what to do, and the committed checkpoint stands.
func TestSilence_DiskFull(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	script := filepath.Join(dir, "full.py")
	if err := os.WriteFile(script, []byte(fullDiskTrainer), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{"PYTHONPATH=" + filepath.Join(repo, "python")}, append(silenceArgs(dir), "--", python, script)...)
	first := p.waitEntry("checkpoint committed", time.Minute, nil)
	w := p.waitEntry("trainer could not save the checkpoint", time.Minute, func(e logEntry) bool { return e.str("cause") == "ENOSPC" })
	if w.str("cause") != "ENOSPC" || !strings.Contains(w.str("fix"), "--checkpoint-dir") || !strings.Contains(w.str("error"), "No space left on device") {
		t.Fatalf("failure logged as cause %q, fix %q, error %q: want ENOSPC and what to do", w.str("cause"), w.str("fix"), w.str("error"))
	}
	step, id := storeLatest(t, filepath.Join(dir, "store"))
	if step != first.num("step") || id != first.str("id") {
		t.Fatalf("latest.json: step %d id %s, want the committed checkpoint (step %d id %s)", step, id, first.num("step"), first.str("id"))
	}
	p.signal(syscall.SIGTERM)
	p.wait(time.Minute)
}
