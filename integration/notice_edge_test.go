package integration

import (
	"errors"
	"fmt"
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
