package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentArgs are the flags every run in these tests shares.
func agentArgs(dir, store string, extra ...string) []string {
	args := []string{"run", "--store", store, "--run-id", "it",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--cloud", "none", "--interval", "1h", "--log-level", "info"}
	return append(args, extra...)
}

// TestRun_SigtermAndResume: a real trainer under spotagent run gets SIGTERM
// part-way, checkpoints, stops; a second run resumes from the committed step
// and ends with exactly the parameters of an uninterrupted run.
func TestRun_SigtermAndResume(t *testing.T) {
	requirePython(t, false)
	dir := shortTemp(t)
	store := "file://" + filepath.Join(dir, "store")
	trainer := []string{"--", python, "python/examples/train.py", "--steps", "150", "--step-time", "0.01"}

	// The reference: the same trainer, uninterrupted, under its own store.
	ref := start(t, nil, append(agentArgs(filepath.Join(dir, "ref"), "file://"+filepath.Join(dir, "refstore")),
		append(trainer, "--out", filepath.Join(dir, "ref.json"))...)...)
	if code := ref.wait(2 * time.Minute); code != 0 {
		t.Fatalf("reference run exit code %d", code)
	}

	first := start(t, nil, append(agentArgs(dir, store), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	first.waitLine(`starting fresh`, time.Minute)
	first.waitLine(`^step 50 `, time.Minute)
	first.signal(syscall.SIGTERM)
	m := first.waitLine(`checkpoint \S+ \(shutdown\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	first.waitLine(`stopping at step`, time.Minute)
	if code := first.wait(time.Minute); code != 0 {
		t.Fatalf("interrupted run exit code %d, want 0 (the trainer stopped cleanly)", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.json")); err == nil {
		t.Fatal("interrupted run finished training: SIGTERM came too late to test anything")
	}

	second := start(t, nil, append(agentArgs(dir, store), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	r := second.waitLine(`resuming from step (\d+) \((.*)\)`, time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	// The restored files are byte for byte those in the store.
	restored := r[2]
	ents, err := os.ReadDir(filepath.Join(dir, "store", "checkpoints"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("store checkpoints: %v %v", ents, err)
	}
	if !strings.HasSuffix(restored, ents[0].Name()) {
		t.Fatalf("restored %s, store holds %s", restored, ents[0].Name())
	}
	sameFile(t, filepath.Join(restored, "state.json"), filepath.Join(dir, "store", "checkpoints", ents[0].Name(), "state.json"))
	if code := second.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, filepath.Join(dir, "out.json"), filepath.Join(dir, "ref.json"))
}
