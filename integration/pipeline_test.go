package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
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

// startPipelineTrainer starts `spotagent run` on a trainer that commits
// one checkpoint of its own (step 10), then waits at step 20. On the
// agent's (shutdown) request it writes model.bin, reports it saved, waits
// until the agent has uploaded it into the file store, then hangs: the
// test kills the agent mid-pipeline.
func startPipelineTrainer(t *testing.T) (*proc, string, string) {
	t.Helper()
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	storeDir := filepath.Join(dir, "store")
	n := strconv.Itoa(1 << 20)
	trainer := fakeTrainer("--step-time", "0", "--own-at", "10", "--steps", "20", "--wait-after", "--file", "model.bin:"+n+":A",
		"--on", "write,saved:model.bin,await:"+filepath.Join(storeDir, "checkpoints", "*-{id}*", "model.bin")+":"+n+",hang")
	p := start(t, nil, append([]string{"run", "--store", "file://" + storeDir, "--run-id", "it", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", filepath.Join(dir, "a.sock"), "--interval", "1h", "--log-format", "json", "--"}, trainer...)...)
	p.waitLine(`trainer: waiting at step 20`, time.Minute) // after its own checkpoint's commit
	p.signal(syscall.SIGTERM)                              // the shutdown checkpoint is the pipelined one
	p.waitLine(`trainer: seen .*/model.bin`, time.Minute)  // the early upload
	return p, dir, storeDir
}

// TestPipeline_AgentKilledMidPipeline: the agent dies (SIGKILL) after a
// file of the checkpoint was uploaded early and before done: nothing of it
// restores; the checkpoint before it does.
func TestPipeline_AgentKilledMidPipeline(t *testing.T) {
	parallel(t)
	p, _, storeDir := startPipelineTrainer(t)
	m := p.waitLine(`trainer: hanging pid (\d+)`, time.Minute)
	t.Cleanup(func() { syscall.Kill(atoi(t, m[1]), syscall.SIGKILL) })
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(time.Minute)
	syscall.Kill(atoi(t, m[1]), syscall.SIGKILL)
	st, err := file.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	early := 0
	for _, k := range storeKeys(t, storeDir) {
		if strings.HasPrefix(k, "checkpoints/000000000020-") {
			early++
		}
	}
	if early == 0 {
		t.Fatal("no early upload in the store: the test did not kill the agent mid-pipeline")
	}
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Manifest.Step != 10 {
		t.Fatalf("restored step %d, want 10 (the half-uploaded checkpoint must never restore)", r.Manifest.Step)
	}
	if l, err := checkpoint.ReadLatest(context.Background(), st); err != nil || l.Step != 10 {
		t.Fatalf("latest=%+v err=%v, want step 10", l, err)
	}
}

func storeKeys(t *testing.T, storeDir string) []string {
	t.Helper()
	st, err := file.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	err = st.List(context.Background(), "", func(o cloud.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return keys
}
