package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
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
// and ends with exactly the parameters of an uninterrupted run (run once,
// the reference of all three). On a file store, the restored files match
// the store's byte for byte; then the same through S3 (gofakes3) and GCS
// (fake-gcs-server), driven by the real SDKs in the binary (until #49 the
// buckets were a test of their own, with a reference run each).
func TestRun_SigtermAndResume(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	ref := referenceRun(t)
	t.Run("file", func(t *testing.T) {
		dir := testutil.ShortDir(t)
		store := "file://" + filepath.Join(dir, "store")
		_, resumed := sigtermAndResume(t, dir, store, nil, ref)
		restored := resumed[1]
		ents, err := os.ReadDir(filepath.Join(dir, "store", "checkpoints"))
		if err != nil || len(ents) != 1 {
			t.Fatalf("store checkpoints: %v %v", ents, err)
		}
		if !strings.HasSuffix(restored, ents[0].Name()) {
			t.Fatalf("restored %s, store holds %s", restored, ents[0].Name())
		}
		sameFile(t, filepath.Join(restored, "state.json"), filepath.Join(dir, "store", "checkpoints", ents[0].Name(), "state.json"))
	})
	t.Run("s3", func(t *testing.T) {
		srv, err := s3test.Start("ckpt")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		sigtermAndResume(t, testutil.ShortDir(t), "s3://ckpt/runs/it", srv.Env(), ref)
	})
	t.Run("gcs", func(t *testing.T) {
		srv, err := gcstest.Start("ckpt")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		sigtermAndResume(t, testutil.ShortDir(t), "gs://ckpt/runs/it", srv.Env(), ref)
	})
}

// noSleep is trainer with --step-time 0: the uninterrupted reference ends
// with the same parameters (train.py only sleeps between steps), sooner.
// The interrupted runs keep their step time and enough steps (1,000, ten
// seconds) that the trainer cannot finish while the shutdown checkpoint
// commits on a loaded machine: it then exits 0, finished, and rightly so
// (a run of 150 steps once did: exit 0, want 75).
func noSleep(trainer []string) []string {
	out := append([]string(nil), trainer...)
	for i := range out[:len(out)-1] {
		if out[i] == "--step-time" {
			out[i+1] = "0"
		}
	}
	return out
}

// sigtermTrainer is the stdlib trainer the SIGTERM tests run.
var sigtermTrainer = []string{"--", python, "python/examples/train.py", "--steps", "1000", "--step-time", "0.01"}

// referenceRun runs the trainer uninterrupted under its own store and
// returns the parameters it ended with (a file).
func referenceRun(t *testing.T) string {
	t.Helper()
	dir := testutil.ShortDir(t)
	out := filepath.Join(dir, "ref.json")
	ref := start(t, nil, append(agentArgs(filepath.Join(dir, "ref"), "file://"+filepath.Join(dir, "refstore")),
		append(noSleep(sigtermTrainer), "--out", out)...)...)
	if code := ref.wait(2 * time.Minute); code != 0 {
		t.Fatalf("reference run exit code %d", code)
	}
	return out
}

// sigtermAndResume runs the stdlib trainer twice on store: interrupted by
// SIGTERM, then resumed; it checks the resume and that the final
// parameters are the reference's (ref, from referenceRun), and returns the
// interruption's and the resume's matched log lines.
func sigtermAndResume(t *testing.T, dir, store string, env []string, ref string) (first, second []string) {
	t.Helper()
	trainer := sigtermTrainer

	run1 := start(t, env, append(agentArgs(dir, store), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	run1.waitLine(`starting fresh`, time.Minute)
	run1.waitLine(`^step 50 `, time.Minute)
	run1.signal(syscall.SIGTERM)
	first = run1.waitLine(`checkpoint \S+ \(shutdown\) at step (\d+)`, time.Minute)
	step := atoi(t, first[1])
	run1.waitLine(`stopping at step`, time.Minute)
	if code := run1.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d (the trainer stopped cleanly)", code, exitInterrupted)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.json")); err == nil {
		t.Fatal("interrupted run finished training: SIGTERM came too late to test anything")
	}

	run2 := start(t, env, append(agentArgs(dir, store), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	second = run2.waitLine(`resuming from step (\d+) \((.*)\)`, time.Minute)
	if got := atoi(t, second[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	if code := run2.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, filepath.Join(dir, "out.json"), ref)
	return first, second[1:]
}
