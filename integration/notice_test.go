package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// The matrix trainer: long enough that the notice lands part-way.
const (
	matrixSteps    = "300"
	matrixStepTime = "0.02"
)

// TestNotice_Matrix: on every cloud (a spot notice from the fake metadata
// server) and to every store, the PyTorch example under spotagent run
// takes an interruption checkpoint that commits before the notice's
// deadline, stops, and a second run restores it and ends with exactly the
// parameters of an uninterrupted run. Each cloud with one store, each store
// once (the notice's source and the store meet only in the deadline, which
// every cell checks): the nine pairs took 450 s of torch slots at load 17,
// and each cloud's and store's own tests cover the rest (pkg/metadata/*,
// pkg/cloud/*; Azure Blob end to end in TestAzure_EndToEnd). Each cell
// holds a torch slot of its own (a -race agent and a PyTorch process).
func TestNotice_Matrix(t *testing.T) {
	t.Parallel() // the cells take the torch slots
	requirePython(t, true)
	// One S3 server for the matrix and the package's GCS server
	// (gcsShared), each cell under its own prefix.
	s3srv := startS3(t)
	gcssrv := gcsShared
	env := append(s3Env(s3srv), gcssrv.Env()...)
	opts := all.Options{S3Endpoint: s3srv.Endpoint}

	// The uninterrupted reference: the example run bare (no agent).
	ref := torchExampleRef(t, matrixSteps)

	for _, c := range []struct{ cloud, store, uri string }{
		{"aws", "s3", "s3://" + s3srv.Bucket + "/matrix/aws"},
		{"gcp", "gcs", "gs://" + gcssrv.Bucket + "/matrix/gcp"},
		{"azure", "file", ""}, // under the subtest's directory
	} {
		t.Run(c.cloud+"/"+c.store, func(t *testing.T) {
			parallelTorch(t)
			dir := testutil.ShortDir(t)
			uri := c.uri
			if uri == "" {
				uri = "file://" + filepath.Join(dir, "store")
			}
			noticeAndResume(t, c.cloud, uri, env, opts, ref, dir)
		})
	}
}

// torchRefs are the uninterrupted runs of the PyTorch example
// (train_torch.py --step-time 0 --steps N, its final parameters), one per
// N, run once for the package: TestAzure_EndToEnd, TestNotice_Matrix and
// TestPipeline_TorchResumesExact compare against the same one.
var torchRefs sync.Map // steps → *torchRef

type torchRef struct {
	once sync.Once
	path string
	err  error
}

// torchExampleRef is the path of the reference run's output for steps.
func torchExampleRef(t *testing.T, steps string) string {
	t.Helper()
	p, err := torchExampleRun(steps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// torchExampleRun runs the reference for steps once (prewarmRefs may have
// started it already) and returns its output's path.
func torchExampleRun(steps string) (string, error) {
	v, _ := torchRefs.LoadOrStore(steps, &torchRef{})
	r := v.(*torchRef)
	r.once.Do(func() {
		r.path = filepath.Join(buildDir, "torch-ref-"+steps+".json")
		cmd := exec.Command(python, "python/examples/train_torch.py", "--steps", steps, "--step-time", "0", "--out", r.path)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			r.err = fmt.Errorf("reference run: %v\n%s", err, out)
		}
	})
	return r.path, r.err
}

// noticeAndResume is one cell of the matrix.
func noticeAndResume(t *testing.T, cl, uri string, env []string, opts all.Options, ref, dir string) {
	out := filepath.Join(dir, "out.json")
	trainer := []string{"--", python, "python/examples/train_torch.py",
		"--steps", matrixSteps, "--step-time", matrixStepTime, "--out", out}
	fk := startFake(t, cl)

	first := start(t, env, append(noticeArgs(dir, uri, cloudArgs(t, cl, fk.URL())...), trainer...)...)
	first.waitLine(`starting fresh`, 2*time.Minute)
	first.waitLine(`^step 100 `, time.Minute)
	var eventID string
	var exposed time.Time
	if az, ok := fk.(*fake.Azure); ok {
		var ev fake.AzureEvent
		ev, exposed = az.Preempt()
		eventID = ev.EventId
	} else {
		exposed = fk.Notice()
	}
	m := first.waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	first.waitLine(`interruption checkpoint committed`, time.Minute)
	first.waitLine(`stopping at step`, time.Minute)
	// The trainer's own code, which the example returns from
	// agent.exit_code (the agent would turn a 0 after a notice into 75).
	first.waitLine(`trainer exited\s.*"code": 75[,}]`, time.Minute)
	if code := first.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d (the trainer stopped cleanly)", code, exitInterrupted)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("interrupted run finished training: the notice came too late to test anything")
	}

	st := openTestStore(t, uri, opts)
	in := oneInterruption(t, noticeJournal(t, st))
	if got, want := string(in.Cloud), cl; got != want {
		t.Fatalf("interruption cloud=%s, want %s", got, want)
	}
	if got, want := in.Kind, string(metadata.KindTermination); got != want {
		t.Fatalf("interruption kind=%s, want %s", got, want)
	}
	if in.Detected.Before(exposed) {
		t.Fatalf("notice detected at %s, before the fake exposed it at %s", in.Detected, exposed)
	}
	committedBeforeDeadline(t, in)
	if got, want := in.Step, int64(step); got != want {
		t.Fatalf("journal step=%d, want %d (what the trainer saved)", got, want)
	}
	if l := readLatestPointer(t, st); l.Step != int64(step) || l.ID != in.CheckpointID {
		t.Fatalf("latest=%+v, want step %d id %s", l, step, in.CheckpointID)
	}
	if eventID != "" {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if err := fk.(*fake.Azure).WaitAck(ctx, eventID); err != nil {
			t.Fatalf("azure event %s never acknowledged: %v (acks %v)", eventID, err, fk.(*fake.Azure).Acks())
		}
	}

	// A new machine: no notice this time.
	fk2 := startFake(t, cl)
	second := start(t, env, append(noticeArgs(dir, uri, cloudArgs(t, cl, fk2.URL())...), trainer...)...)
	r := second.waitLine(`resuming from step (\d+) `, 2*time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	if code := second.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, out, ref)
	j := noticeJournal(t, st)
	if len(j.Restores) != 1 || j.Restores[0].Step != int64(step) || j.Restores[0].CheckpointID != in.CheckpointID {
		t.Fatalf("journal restores=%+v, want one of checkpoint %s at step %d", j.Restores, in.CheckpointID, step)
	}
	if len(j.Interruptions) != 1 {
		t.Fatalf("the run without a notice recorded an interruption: %+v", j.Interruptions)
	}
}
