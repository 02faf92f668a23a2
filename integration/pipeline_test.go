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

func startPipelineTrainer(t *testing.T, mode string) (*proc, string, string) {
	t.Helper()
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	storeDir := filepath.Join(dir, "store")
	// The trainer commits one checkpoint of its own (step 10), then waits
	// at step 20. On the agent's (shutdown) request it writes model.bin
	// (A), reports it saved, waits until the agent has uploaded it into
	// the file store, then, by mode:
	//
	//	modify  rewrites model.bin in place (B, same size), sends the bad
	//	        saved messages (outside, twice, missing), and answers done;
	//	hang    waits to be killed (the agent is killed mid-pipeline by
	//	        the test).
	n := strconv.Itoa(1 << 20)
	then := map[string]string{
		"modify": "write:model.bin:" + n + ":B,saved:../../outside.bin,saved:model.bin,saved:missing.bin,done",
		"hang":   "hang",
	}[mode]
	trainer := fakeTrainer("--step-time", "0", "--own-at", "10", "--steps", "20", "--wait-after", "--file", "model.bin:"+n+":A",
		"--on", "write,saved:model.bin,await:"+filepath.Join(storeDir, "checkpoints", "*-{id}*", "model.bin")+":"+n+","+then)
	os.WriteFile(filepath.Join(dir, "outside.bin"), []byte("not for the store"), 0o600)
	p := start(t, nil, append([]string{"run", "--store", "file://" + storeDir, "--run-id", "it", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", filepath.Join(dir, "a.sock"), "--interval", "1h", "--log-format", "json", "--"}, trainer...)...)
	p.waitLine(`trainer: waiting at step 20`, time.Minute) // after its own checkpoint's commit
	p.signal(syscall.SIGTERM)                              // the shutdown checkpoint is the pipelined one
	p.waitLine(`trainer: seen .*/model.bin`, time.Minute)  // the early upload
	return p, dir, storeDir
}

// TestPipeline_ModifiedAfterSaved: a file rewritten after `saved` is
// uploaded again at done, never committed with the bytes the early upload
// read; the bad `saved` messages get errors and add nothing.
func TestPipeline_ModifiedAfterSaved(t *testing.T) {
	parallel(t)
	p, _, storeDir := startPipelineTrainer(t, "modify")
	e := p.waitEntry("checkpoint committed", time.Minute, func(e logEntry) bool { return e.num("step") == 20 })
	if e.num("early") != 0 || e.num("files") != 1 {
		t.Fatalf("committed %d files, %d of them early; want 1 and 0 (model.bin changed after saved)", e.num("files"), e.num("early"))
	}
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d", code)
	}
	// The trainer rewrites model.bin once the early upload's object is whole
	// in the store; the agent may still be checking what it read (then the
	// early upload fails: "file changed while it was uploaded") or be done
	// with it (then done finds it changed). Either way it is uploaded again.
	if len(p.entries("file changed after it was reported saved: uploading it again")) == 0 &&
		len(p.entries("early upload failed: the file is uploaded again at done")) == 0 {
		t.Fatal("spotagent said neither that model.bin changed after saved nor that its early upload failed")
	}
	refused := p.entries("saved refused: the file is checked at done like any other")
	var why []string
	for _, r := range refused {
		why = append(why, r.str("error"))
	}
	if len(refused) != 3 || !strings.Contains(strings.Join(why, "|"), "already reported saved") {
		t.Fatalf("saved refusals %q, want outside, twice and missing", why)
	}
	st, err := file.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Manifest.Step != 20 || len(r.Manifest.Files) != 1 {
		t.Fatalf("restored step %d with %d files", r.Manifest.Step, len(r.Manifest.Files))
	}
	b := readFile(t, filepath.Join(r.Dir, "model.bin"))
	if strings.Trim(string(b), "B") != "" {
		t.Fatalf("model.bin restored with the bytes from before it changed (%q…)", b[:8])
	}
	for _, k := range storeKeys(t, storeDir) {
		if strings.Contains(k, "outside") || strings.Contains(k, "missing") {
			t.Fatalf("object %s uploaded from a refused saved", k)
		}
	}
}

// TestPipeline_AgentKilledMidPipeline: the agent dies (SIGKILL) after a
// file of the checkpoint was uploaded early and before done: nothing of it
// restores; the checkpoint before it does.
func TestPipeline_AgentKilledMidPipeline(t *testing.T) {
	parallel(t)
	p, _, storeDir := startPipelineTrainer(t, "hang")
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
