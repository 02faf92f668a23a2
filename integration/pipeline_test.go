package integration

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
)

// Issue 16: pipelined commit and the non-blocking save, end to end.

// TestPipeline_TorchResumesExact: the PyTorch example saves without
// blocking (spotagent.torch.save, its default); a spot notice on AWS with an
// S3 store; every file of the interruption checkpoint is uploaded on its
// `saved`, before done; the resumed run ends bit-identical to an
// uninterrupted one.
func TestPipeline_TorchResumesExact(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	s3srv, err := s3test.Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3srv.Close)
	env := s3Env(s3srv)
	ref := torchExampleRef(t, matrixSteps)
	dir := testutil.ShortDir(t)
	uri := "s3://" + s3srv.Bucket + "/pipeline"
	out := filepath.Join(dir, "out.json")
	trainer := []string{"--", python, "python/examples/train_torch.py", "--steps", matrixSteps,
		"--step-time", matrixStepTime, "--out", out, "--save-bytes", strconv.Itoa(4 << 20)}
	fk := startFake(t, "aws")
	first := start(t, env, append(noticeArgs(dir, uri, append(cloudArgs(t, "aws", fk.URL()), "--log-format", "json")...), trainer...)...)
	first.waitLine(`starting fresh`, 2*time.Minute)
	first.waitLine(`step 100 `, time.Minute)
	fk.Notice()
	m := first.waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	e := first.waitEntry("checkpoint committed", time.Minute, nil)
	// model.pt, optim.pt, state.pt and payload.bin: all uploaded early.
	if got, want := e.num("early"), int64(4); got != want || e.num("files") != want {
		t.Fatalf("checkpoint committed with %d of %d files uploaded early, want %d", got, e.num("files"), want)
	}
	if code := first.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
	}
	fk2 := startFake(t, "aws")
	second := start(t, env, append(noticeArgs(dir, uri, cloudArgs(t, "aws", fk2.URL())...), trainer...)...)
	r := second.waitLine(`resuming from step (\d+) `, 2*time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	if code := second.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, out, ref)
}
