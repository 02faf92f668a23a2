package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// TestRun_SignalFallback: a trainer that does not speak the protocol,
// under --signal SIGUSR1. Periodic checkpoints reach it as a signal and a
// request file; its marker file commits them; SIGTERM to the agent takes a
// shutdown checkpoint and stops it; the next run resumes there and ends
// with the uninterrupted run's result.
func TestRun_SignalFallback(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	trainer := []string{"--", python, "python/examples/train_signal.py", "--steps", "6000", "--step-time", "0.005"}
	out := filepath.Join(dir, "out.json")

	refCmd := exec.Command(python, "python/examples/train_signal.py", "--steps", "6000", "--out", filepath.Join(dir, "ref.json"))
	refCmd.Dir = repo
	ref := startCmd(t, refCmd)
	if code := ref.wait(time.Minute); code != 0 {
		t.Fatalf("reference run exit code %d", code)
	}

	args := append(agentArgs(dir, store, "--signal", "SIGUSR1", "--interval", "1s"), append(trainer, "--out", out)...)
	run1 := start(t, nil, args...)
	run1.waitLine(`trainer signalled.*SIGUSR1`, time.Minute)
	run1.waitLine(`checkpoint saved at step \d+ \(periodic\)`, time.Minute)
	run1.waitLine(`checkpoint committed`, time.Minute)
	run1.signal(syscall.SIGTERM)
	m := run1.waitLine(`checkpoint saved at step (\d+) \(shutdown\)`, time.Minute)
	step := atoi(t, m[1])
	run1.waitLine(`stopping at step`, time.Minute)
	if code := run1.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("interrupted run finished training: SIGTERM came too late to test anything")
	}
	// The marker is the trainer's answer, not part of the checkpoint.
	markers, _ := filepath.Glob(filepath.Join(dir, "store", "checkpoints", "*", "SPOTAGENT_DONE"))
	if len(markers) != 0 {
		t.Fatalf("done markers uploaded: %v", markers)
	}

	run2 := start(t, nil, args...)
	if got := atoi(t, run2.waitLine(`resumed at step (\d+)`, time.Minute)[1]); got != step {
		t.Fatalf("resumed at step %d, want %d", got, step)
	}
	if code := run2.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, out, filepath.Join(dir, "ref.json"))
}

// TestRun_SignalFallbackNoHandler: a trainer that has not installed a
// handler is not signalled (the signal would kill it); the request fails
// with a clear line and the trainer keeps running.
func TestRun_SignalFallbackNoHandler(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	alive := filepath.Join(dir, "alive")
	p := start(t, nil, append(agentArgs(dir, "file://"+filepath.Join(dir, "store"), "--signal", "USR1", "--interval", "1s"),
		"--", "/bin/sh", "-c", "sleep 2; touch "+alive+"; sleep 60")...)
	p.waitLine(`has no SIGUSR1 handler`, time.Minute)
	testutil.WaitWithin(t, "the trainer to outlive the request", time.Minute, func() bool {
		_, err := os.Stat(alive)
		return err == nil
	})
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit code %d, want %d (the trainer stopped by SIGTERM)", code, 128+int(syscall.SIGTERM))
	}
	if regexp.MustCompile(`checkpoint committed`).MatchString(p.output()) {
		t.Fatal("a checkpoint was committed for a trainer that never saved one")
	}
}

// TestRun_SignalFallbackTrainerDies: a trainer that dies of the shutdown
// request (its handler exits without saving) fails it at once rather than
// at the deadline; the agent exits with the trainer's code, commits
// nothing, and asks nothing more of a trainer that is gone.
func TestRun_SignalFallbackTrainerDies(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	// A trainer of the signal fallback (no socket) whose SIGUSR1 handler
	// exits 3 without saving.
	p := start(t, nil, append(append(agentArgs(dir, "file://"+filepath.Join(dir, "store"), "--signal", "SIGUSR1", "--term-grace", "60s"), "--"),
		fakeTrainer("--no-socket", "--exit-on-signal", "SIGUSR1:3")...)...)
	p.waitLine(`^trainer: exits 3 on SIGUSR1$`, time.Minute) // not the command line the agent logs
	p.signal(syscall.SIGTERM)
	p.waitLine(`trainer could not save the checkpoint.*exited before saving`, time.Minute)
	if code := p.wait(30 * time.Second); code != 3 { // well before the 60 s grace
		t.Fatalf("exit code %d, want the trainer's 3", code)
	}
	out := p.output()
	if regexp.MustCompile(`checkpoint committed`).MatchString(out) {
		t.Fatal("a checkpoint was committed for a trainer that never saved one")
	}
	if strings.Contains(out, "trainer not running") {
		t.Fatal("a request was sent after the trainer was gone")
	}
}
