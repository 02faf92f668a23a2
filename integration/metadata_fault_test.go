package integration

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// Metadata faults (issue 8): a metadata service that flaps, and an IMDSv2
// token endpoint that hangs, never stop the periodic checkpoints and never
// produce a false notice; a real notice after recovery still works.

// flapDuration is how long the metadata service flaps: 12 s in `make test`;
// SPOTAGENT_SOAK=<duration> (say 10m) for the soak, SPOTAGENT_SOAK=1 for 5m.
func flapDuration() time.Duration {
	v := os.Getenv("SPOTAGENT_SOAK")
	if v == "" {
		return 12 * time.Second
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return 5 * time.Minute
	}
	return 12 * time.Second
}

func TestMetadataFault_Flapping(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	for _, c := range []struct {
		cloud string             // --cloud
		what  string             // the source's fault log: "<what> failed" / "<what> recovered"
		start func() fake.Server // the fake
	}{
		{"aws", "imds poll", func() fake.Server { return fake.NewAWS(fake.AWSOptions{}) }},
		// Hanging GETs end every 500 ms (GCE allows up to timeout_sec), so
		// that the faults reach the watch as new requests.
		{"gcp", "metadata watch", func() fake.Server { return fake.NewGCP(fake.GCPOptions{MaxWait: 500 * time.Millisecond}) }},
		{"azure", "scheduled events poll", func() fake.Server { return fake.NewAzure(fake.AzureOptions{}) }},
	} {
		t.Run(c.cloud, func(t *testing.T) {
			// The three clouds side by side, in the test's one slot:
			// each agent and its trainer idle between 1 s commits.
			t.Parallel()
			srv := c.start()
			t.Cleanup(srv.Close)
			p := startWithMetadata(t, srv, c.cloud)
			flapMetadata(t, p, srv, flapDuration(), func() {})
			// The recovery is logged at the source's first good answer
			// after the faults: up to its 10 s backoff ceiling after the
			// last one, plus the poll.
			testutil.WaitWithin(t, "the agent's "+c.what+" failed/recovered log lines (none: the faults did not reach the source)", 30*time.Second, func() bool {
				return len(p.entries(c.what+" failed")) > 0 && len(p.entries(c.what+" recovered")) > 0
			})
			realNotice(t, p, srv)
		})
	}
}

// TestMetadataFault_TokenHangs: the IMDSv2 token PUT hangs (the hop-limit
// problem of containers) after the tokens in hand were revoked, for a few
// seconds, alternating with the data paths flapping.
func TestMetadataFault_TokenHangs(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	imds := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds.Close)
	p := startWithMetadata(t, imds, "aws")
	hung := 0
	flapMetadata(t, p, imds, flapDuration(), func() {
		// Between data faults: revoke the tokens and hang their renewal.
		imds.RevokeTokens()
		imds.SetTokenFault(fake.FaultHang)
		hung++
		time.Sleep(3 * time.Second) // fault injection: how long the fault lasts
		imds.SetTokenFault(fake.FaultNone)
	})
	if hung == 0 {
		t.Fatal("the token endpoint never hung")
	}
	if len(p.entries("imds poll failed")) == 0 {
		t.Fatal("no imds poll failed line: the hanging token endpoint went unnoticed")
	}
	realNotice(t, p, imds)
}

// startWithMetadata runs the agent against srv, a 1 s periodic interval
// and a polling trainer, and waits for the first commit.
func startWithMetadata(t *testing.T, srv fake.Server, cloud string) *proc {
	t.Helper()
	dir := testutil.ShortDir(t)
	name, value := srv.Env()
	args := hostileArgs(dir, "--cloud", cloud, "--poll-interval", "200ms")
	p := start(t, []string{name + "=" + value}, append(args, writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("checkpoint committed", time.Minute, nil)
	return p
}

// flapMetadata cycles every fault on and off for d, calling between after each
// healthy pause, and checks that periodic checkpoints kept committing all
// along and that no notice was seen.
func flapMetadata(t *testing.T, p *proc, srv fake.Server, d time.Duration, between func()) {
	t.Helper()
	before := len(p.entries("checkpoint committed"))
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		srv.SetFault(fake.Faults[i%len(fake.Faults)])
		time.Sleep(time.Second) // fault injection: how long the fault lasts
		srv.SetFault(fake.FaultNone)
		time.Sleep(500 * time.Millisecond)
		between()
		if n := p.entries("interruption notice"); len(n) > 0 {
			t.Fatalf("false notice while the metadata service flapped: %v", n[0])
		}
	}
	took := time.Since(start)
	commits := len(p.entries("checkpoint committed")) - before
	t.Logf("flapped for %s: %d periodic checkpoints committed meanwhile", took.Round(time.Second), commits)
	// The interval is 1 s and a commit takes milliseconds: one every 3 s
	// is a floor that only a stalled scheduler misses.
	if want := int(took / (3 * time.Second)); commits < want {
		t.Fatalf("%d checkpoints committed in %s of metadata faults, want at least %d", commits, took, want)
	}
	if failed := p.entries("checkpoint not committed"); len(failed) > 0 {
		t.Fatalf("a checkpoint failed while the metadata service flapped: %v", failed[0])
	}
}

// realNotice exposes a real termination notice on the healed service: the
// agent sees it, takes the interruption checkpoint, stops the trainer.
func realNotice(t *testing.T, p *proc, srv fake.Server) {
	t.Helper()
	srv.SetFault(fake.FaultNone)
	srv.Notice()
	// Up to the 10 s backoff ceiling after the faults, plus the poll.
	n := p.waitEntry("interruption notice", 30*time.Second, nil)
	if n.str("kind") != "termination" {
		t.Fatalf("notice kind %q, want termination", n.str("kind"))
	}
	p.waitEntry("interruption checkpoint committed: stopping the trainer", time.Minute, nil)
	p.waitRe(`^trainer: got stop .*reason=interruption`, 30*time.Second)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	if got := len(p.entries("interruption notice")); got != 1 {
		t.Fatalf("%d interruption notices logged, want 1", got)
	}
}
