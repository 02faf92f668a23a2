package integration

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// TestNotice_DuringPeriodicUpload: a notice arrives while a periodic
// checkpoint is uploading (held in flight by a proxy in front of S3). The
// interruption checkpoint cancels it, commits before the deadline and is
// the newest; the periodic one never commits.
func TestNotice_DuringPeriodicUpload(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	s3srv, err := s3test.Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3srv.Close)
	gate := newGateProxy(t, s3srv.Endpoint)
	env := append(s3Env(s3srv), "AWS_ENDPOINT_URL_S3="+gate.URL)
	dir := testutil.ShortDir(t)
	uri := "s3://" + s3srv.Bucket + "/inflight"
	aws := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(aws.Close)

	args := noticeArgs(dir, uri, append(cloudArgs(t, "aws", aws.URL()), "--interval", "2s")...)
	p := start(t, env, append(args, "--", python, "python/examples/train.py",
		"--steps", "100000", "--step-time", "0.01", "--save-bytes", fmt.Sprint(32<<20))...)
	periodic := p.waitLine(`checkpoint requested.*"id": "([^"]+)", "reason": "periodic"`, 2*time.Minute)[1]
	pstep := atoi(t, p.waitLine(`checkpoint `+regexp.QuoteMeta(periodic)+` \(periodic\) at step (\d+)`, time.Minute)[1])
	gate.waitHeld(t, periodic, time.Minute) // its upload is in flight, and stays there
	aws.Notice()
	urgent := p.waitLine(`checkpoint requested.*"id": "([^"]+)", "reason": "interruption"`, time.Minute)[1]
	gate.allow(urgent)
	p.waitLine(`cancelling periodic upload: interruption checkpoint takes priority.*"id": "`+regexp.QuoteMeta(periodic)+`"`, time.Minute)
	// Up to the notice's 2 minutes: that it committed before the
	// deadline is checked below, from the journal (a loaded machine once
	// took 50 s for the 32 MiB here).
	p.waitLine(`interruption checkpoint committed`, 3*time.Minute)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}

	st := openTestStore(t, uri, all.Options{S3Endpoint: s3srv.Endpoint})
	in := oneInterruption(t, noticeJournal(t, st))
	committedBeforeDeadline(t, in)
	if in.CheckpointID != urgent {
		t.Fatalf("interruption checkpoint=%s, want %s", in.CheckpointID, urgent)
	}
	if l := readLatestPointer(t, st); l.ID != urgent {
		t.Fatalf("latest=%+v, want the interruption checkpoint %s", l, urgent)
	}
	pkey := fmt.Sprintf("checkpoints/%012d-%s/manifest.json", pstep, periodic)
	if _, err := st.Stat(t.Context(), pkey); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat %s: %v, want not found (the cancelled periodic checkpoint must not commit)", pkey, err)
	}
}

// TestNotice_AzureAckAfterCommit: the Azure Preempt event is acknowledged
// only once the interruption checkpoint is committed. A proxy in front of
// the fake IMDS reads latest.json at the instant the acknowledgement
// arrives: it must already name the interruption checkpoint.
func TestNotice_AzureAckAfterCommit(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	uri := "file://" + filepath.Join(dir, "store")
	st := openTestStore(t, uri, all.Options{})
	az := fake.NewAzure(fake.AzureOptions{})
	t.Cleanup(az.Close)
	rec := newAckRecorder(t, az.URL(), st)

	p := start(t, nil, append(noticeArgs(dir, uri, cloudArgs(t, "azure", rec.URL)...),
		"--", python, "python/examples/train.py", "--steps", "100000", "--step-time", "0.01")...)
	p.waitLine(`^step 50 `, 2*time.Minute)
	ev, _ := az.Preempt()
	p.waitLine(`interruption checkpoint committed`, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := az.WaitAck(ctx, ev.EventId); err != nil {
		t.Fatalf("event %s not acknowledged: %v", ev.EventId, err)
	}
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	if got := az.Acks(); len(got) != 1 || got[0] != ev.EventId {
		t.Fatalf("acks=%v, want exactly [%s]", got, ev.EventId)
	}

	in := oneInterruption(t, noticeJournal(t, st))
	committedBeforeDeadline(t, in)
	acks := rec.seen()
	if len(acks) != 1 {
		t.Fatalf("%d acknowledgements reached the fake, want 1", len(acks))
	}
	ack := acks[0]
	if ack.err != nil || ack.latest.ID != in.CheckpointID {
		t.Fatalf("when the ack arrived latest.json was %+v (err %v), want the interruption checkpoint %s",
			ack.latest, ack.err, in.CheckpointID)
	}
	if !ack.at.After(*in.Committed) {
		t.Fatalf("ack at %s, not after the commit at %s", ack.at, in.Committed)
	}
	if !ack.at.Before(*in.Deadline) {
		t.Fatalf("ack at %s, not before the event's NotBefore %s", ack.at, in.Deadline)
	}
}
