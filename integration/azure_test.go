package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/azuritetest"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/azblob"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// TestAzure_EndToEnd: Azure from the notice to the resume, with nothing
// but Azure's own interfaces. The PyTorch example runs under spotagent
// with an az:// store on Azurite (Microsoft's Blob emulator, a shared key
// from AZURE_STORAGE_CONNECTION_STRING: no credential chain, no metadata
// endpoint asked for a token) and the fake Azure IMDS. A Scheduled Events
// Preempt makes it checkpoint; the checkpoint is committed to Blob
// storage, and only then is the event acknowledged (a proxy reads
// latest.json from the container at the instant the acknowledgement
// arrives). A fresh agent on a "new machine" (its own checkpoint
// directory, no notice) resumes from the container and ends with exactly
// the parameters of an uninterrupted run. list and history read the run
// from the same URI.
func TestAzure_EndToEnd(t *testing.T) {
	// The agents get the emulator's connection string in their
	// environment (srv.Env), this process's client in its options: the
	// process environment is left alone, and the test runs in parallel.
	parallelTorch(t)
	requirePython(t, true)
	srv := azuritetest.New(t)
	env := srv.Env()
	uri := "az://" + azuritetest.Container + "/e2e"

	ref := torchExampleRef(t, matrixSteps)

	st := openTestStore(t, uri, all.Options{AzureCredentials: azblob.Credentials{ConnectionString: srv.ConnectionString()}})
	az := fake.NewAzure(fake.AzureOptions{})
	t.Cleanup(az.Close)
	rec := newAckRecorder(t, az.URL(), st)

	dir := testutil.ShortDir(t)
	out := filepath.Join(dir, "out.json")
	trainer := []string{"--", python, "python/examples/train_torch.py",
		"--steps", matrixSteps, "--step-time", matrixStepTime, "--out", out}
	first := start(t, env, append(noticeArgs(dir, uri, cloudArgs(t, "azure", rec.URL)...), trainer...)...)
	first.waitLine(`starting fresh`, 2*time.Minute)
	first.waitLine(`^step 100 `, time.Minute)
	ev, _ := az.Preempt()
	m := first.waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	first.waitLine(`interruption checkpoint committed`, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := az.WaitAck(ctx, ev.EventId); err != nil {
		t.Fatalf("event %s not acknowledged: %v", ev.EventId, err)
	}
	if code := first.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
	}

	in := oneInterruption(t, noticeJournal(t, st))
	committedBeforeDeadline(t, in)
	if in.Step != int64(step) || string(in.Cloud) != "azure" {
		t.Fatalf("interruption %+v, want azure at step %d", in, step)
	}
	acks := rec.seen()
	if len(acks) != 1 || acks[0].err != nil || acks[0].latest.ID != in.CheckpointID {
		t.Fatalf("acknowledgements %+v: want one, when latest.json in the container already named %s", acks, in.CheckpointID)
	}
	if !acks[0].at.After(*in.Committed) {
		t.Fatalf("ack at %s, not after the commit at %s", acks[0].at, in.Committed)
	}
	// The checkpoint's objects are block blobs in the container.
	n := 0
	if err := st.List(t.Context(), "checkpoints/", func(oi cloud.ObjectInfo) error {
		if strings.Contains(oi.Key, in.CheckpointID) {
			n++
		}
		return nil
	}); err != nil || n < 2 {
		t.Fatalf("%d objects of checkpoint %s in the container (err %v), want its data and manifest", n, in.CheckpointID, err)
	}

	// A new machine: another checkpoint directory, another IMDS, no notice.
	dir2 := testutil.ShortDir(t)
	fk2 := startFake(t, "azure")
	second := start(t, env, append(noticeArgs(dir2, uri, cloudArgs(t, "azure", fk2.URL())...),
		"--", python, "python/examples/train_torch.py", "--steps", matrixSteps, "--step-time", matrixStepTime, "--out", out)...)
	r := second.waitLine(`resuming from step (\d+) `, 2*time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	if code := second.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, out, ref)

	if got := runSpotagentTool(t, env, "list", "--store", uri); !strings.Contains(got, in.CheckpointID) {
		t.Fatalf("spotagent list --store %s does not show checkpoint %s:\n%s", uri, in.CheckpointID, got)
	}
	if got := runSpotagentTool(t, env, "history", "--store", uri); !strings.Contains(strings.ToLower(got), "azure") {
		t.Fatalf("spotagent history --store %s does not show the azure interruption:\n%s", uri, got)
	}
}
