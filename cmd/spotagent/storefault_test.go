package main

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// `spotagent run` in-process with the Python example trainer against S3
// and GCS (the in-process fakes) behind a fault proxy (internal/faultproxy):
// periodic and SIGTERM checkpoints commit through retryable faults; a
// store that dies during the interruption costs the shutdown checkpoint,
// not a busy loop, and the journal records it. (End to end in integration
// until #49; the store clients are the CLI's, the same in-process.)

// faultStores is a store in-process behind a fault proxy: this process's
// environment points the in-process agent through the proxy (t.Setenv:
// not for parallel tests), and direct reaches the store without it, to
// check what landed.
type faultStores struct {
	proxy  *faultproxy.Proxy
	direct cloud.Store
	uri    string
}

// faultStoresFor starts backend's server (s3 or gcs) and its proxy for the
// test. The GCS library reads STORAGE_EMULATOR_HOST when a client is made:
// direct is made before the variable points at the proxy.
func faultStoresFor(t *testing.T, backend, prefix string) *faultStores {
	t.Helper()
	fs := &faultStores{}
	var directOpts all.Options
	switch backend {
	case "s3":
		srv := s3test.New(t) // its credentials in the environment
		fs.proxy = faultproxy.New(t, srv.Endpoint)
		fs.uri = "s3://" + srv.Bucket + "/" + prefix
		directOpts.S3Endpoint = srv.Endpoint
		t.Setenv("AWS_ENDPOINT_URL_S3", fs.proxy.URL)
	case "gcs":
		srv, err := gcstest.Start("spotagent-test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		fs.proxy = faultproxy.New(t, "http://"+srv.Host)
		fs.uri = "gs://" + srv.Bucket + "/" + prefix
		t.Setenv("STORAGE_EMULATOR_HOST", srv.Host)
		defer t.Setenv("STORAGE_EMULATOR_HOST", fs.proxy.Host)
	default:
		t.Fatalf("backend %q", backend)
	}
	st, err := all.Open(t.Context(), fs.uri, directOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fs.direct = st
	return fs
}

// faultIsWrite matches requests that carry object data.
func faultIsWrite(r *http.Request) bool {
	return r.Method == http.MethodPut || r.Method == http.MethodPost
}

// faultRun starts `spotagent run` in-process on the store uri with the
// trainer (after "--"), logging JSON at info; a test that fails half-way
// stops it at its end (the proxy cleared first, so the shutdown's writes
// land), with this process's SIGTERM (guardSIGTERM first).
func faultRun(t *testing.T, fs *faultStores, dir string, flags []string, trainer []string) *cliAgent {
	t.Helper()
	args := append([]string{"run", "--store", fs.uri, "--run-id", "it", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", filepath.Join(dir, "a.sock"), "--interval", "1h", "--log-level", "info", "--log-format", "json"}, flags...)
	a := startStoppedAtEnd(t, append(append(args, "--"), trainer...)...)
	t.Cleanup(fs.proxy.Clear) // before the stop's cleanup: its writes land
	return a
}

// faultStep is a log entry's "step".
func faultStep(t *testing.T, e map[string]any) int64 {
	t.Helper()
	s, ok := e["step"].(float64)
	if !ok {
		t.Fatalf("log line without a step: %v", e)
	}
	return int64(s)
}

// faultCPU is the user and system CPU time this process (the in-process
// agent, the store and its proxy; not the trainer) has used so far.
func faultCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStoreFault_AgentThroughFaults runs `spotagent run` with the example
// trainer against S3 and GCS behind a proxy that fails a quarter of the
// writes (500, SlowDown, resets) and slows the rest: periodic checkpoints
// still commit, the SIGTERM checkpoint commits and latest.json names it.
func TestStoreFault_AgentThroughFaults(t *testing.T) {
	for _, backend := range []string{"s3", "gcs"} {
		t.Run(backend, func(t *testing.T) {
			fs := faultStoresFor(t, backend, "agent")
			dir := shortTempDir(t)
			modes := []faultproxy.Fault{
				{Mode: faultproxy.InternalError, Fraction: 0.25, Match: faultIsWrite},
				{Mode: faultproxy.SlowDown, Fraction: 0.25, Match: faultIsWrite},
				{Mode: faultproxy.ResetRequest, After: 32 << 10, Fraction: 0.25, Match: faultIsWrite},
			}
			fs.proxy.Set(modes[0]) // the start's writes too
			trainerLog := filepath.Join(dir, "trainer.log")
			a := faultRun(t, fs, dir, []string{"--cloud", "none", "--interval", "1s"},
				outputTo(t, trainerLog, exampleTrainer(t, "--steps", "1000000", "--step-time", "0.01", "--save-bytes", strconv.Itoa(3<<20))))
			// Two commits under each fault (the second requested after
			// the switch), switched while the agent runs.
			commits := 0
			for _, f := range modes {
				fs.proxy.Set(f)
				commits += 2
				a.countWithin(t, "checkpoint committed", commits, 2*time.Minute, nil)
			}
			sigtermSelf(t)
			// The agent's line: a periodic request pending at the signal
			// becomes the shutdown's checkpoint, and the trainer saves it
			// under the reason it was asked with (periodic).
			e := a.entryWithin(t, "interruption checkpoint committed: stopping the trainer", time.Minute, nil)
			if code := a.waitWithin(t, 2*time.Minute); code != 75 {
				t.Fatalf("agent exit code %d, want 75:\n%s", code, a.stderr.String())
			}
			if s := fs.proxy.Stats(); s.Faults == 0 {
				t.Fatalf("no fault injected in %d requests", s.Requests)
			}
			// A commit that failed: "checkpoint not committed". Not the
			// periodic upload the SIGTERM cancelled ("periodic checkpoint
			// not committed: the interruption checkpoint took priority"),
			// which the end-to-end test's substring also matched: with
			// uploads slowed by the faults (and -race) the SIGTERM often
			// comes during one.
			if n := len(a.entries("checkpoint not committed", nil)); n > 0 {
				t.Fatalf("%d commits failed through retryable faults:\n%s", n, a.stderr.String())
			}
			l, err := checkpoint.ReadLatest(context.Background(), fs.direct)
			if want := faultStep(t, e); err != nil || l.Step != want {
				t.Fatalf("latest.json %+v (err %v), want the shutdown checkpoint at step %d", l, err, want)
			}
		})
	}
}

// TestStoreFault_DownDuringInterruption: the store goes down for good
// (every connection reset) after a periodic checkpoint committed; SIGTERM's
// checkpoint cannot upload before its deadline. The agent must not spin
// (this process, the agent's, well under a core while it retries), must
// give up at the deadline with "checkpoint not committed", tell the
// trainer (upload_failed, which the client logs), record the failure in
// the journal once the store is back, and leave the previous checkpoint as
// latest.
func TestStoreFault_DownDuringInterruption(t *testing.T) {
	fs := faultStoresFor(t, "s3", "down")
	dir := shortTempDir(t)
	trainerLog := filepath.Join(dir, "trainer.log")
	a := faultRun(t, fs, dir, []string{"--cloud", "none", "--interval", "2s", "--term-grace", "12s", "--margin", "1s",
		"--s3-part-size", strconv.Itoa(5 << 20)},
		outputTo(t, trainerLog, exampleTrainer(t, "--steps", "1000000", "--step-time", "0.01", "--save-bytes", strconv.Itoa(6<<20))))
	first := a.entryWithin(t, "checkpoint committed", 2*time.Minute, nil)
	firstID, _ := first["id"].(string)
	firstStep := faultStep(t, first)

	fs.proxy.Set(faultproxy.Fault{Mode: faultproxy.ResetRequest})
	sigtermSelf(t)
	// The shutdown checkpoint is a new request, or the periodic one
	// pending at the signal (then the trainer saves it as periodic).
	var id string
	testutil.WaitWithin(t, "the shutdown's checkpoint request", time.Minute, func() bool {
		for _, e := range a.entries("checkpoint requested", nil) {
			if e["reason"] == "shutdown" {
				id, _ = e["id"].(string)
			}
		}
		if es := a.entries("the pending periodic checkpoint becomes the interruption checkpoint", nil); len(es) > 0 {
			id, _ = es[0]["id"].(string)
		}
		return id != "" || a.ended()
	})
	if id == "" {
		t.Fatalf("spotagent exited %d without a shutdown checkpoint:\n%s", a.code, a.stderr.String())
	}
	saved := regexp.MustCompile(`checkpoint ` + regexp.QuoteMeta(id) + ` \(\w+\) at step`)
	testutil.WaitWithin(t, "the trainer's save of "+id, time.Minute, func() bool {
		return saved.MatchString(testutil.ReadFile(t, trainerLog))
	})
	// While the upload retries against a dead store, measure this
	// process's CPU (the agent's, beside the idle store and the proxy)
	// over a few seconds.
	cpu0, t0 := faultCPU(t), time.Now()
	testutil.WaitWithin(t, "a CPU measurement window", 10*time.Second, func() bool { return time.Since(t0) >= 4*time.Second })
	cpu1, t1 := faultCPU(t), time.Now()
	// (A periodic upload the shutdown cancelled may have given up: only
	// the shutdown checkpoint's own failure spoils the window.)
	for _, e := range a.entries("checkpoint not committed", nil) {
		if e["reason"] == "shutdown" {
			t.Fatal("the upload gave up before its deadline: the window did not measure a retrying agent")
		}
	}
	if frac := float64(cpu1-cpu0) / float64(t1.Sub(t0)); frac > 0.20 {
		t.Fatalf("agent used %.0f%% of a core while the store was down (busy loop?)", 100*frac)
	} else {
		t.Logf("agent CPU while the store was down: %.1f%% of a core (%s over %s)", 100*frac, cpu1-cpu0, t1.Sub(t0).Round(time.Millisecond))
	}

	a.entryWithin(t, "checkpoint not committed", time.Minute, func(e map[string]any) bool { return e["reason"] == "shutdown" })
	// upload_failed was sent: the trainer logs it ("upload failed"), or,
	// when the agent had already stopped the trainer at the deadline, the
	// agent logs that it could not deliver it.
	testutil.WaitWithin(t, "upload_failed at the trainer", 30*time.Second, func() bool {
		if strings.Contains(testutil.ReadFile(t, trainerLog), "upload failed") {
			return true
		}
		for _, e := range a.entries("message not delivered", nil) {
			if e["type"] == "upload_failed" {
				return true
			}
		}
		return false
	})
	fs.proxy.Clear() // back, so the journal can be saved
	a.waitWithin(t, time.Minute)
	if fs.proxy.Stats().Faults == 0 {
		t.Fatal("no request reached the dead store")
	}

	ctx := context.Background()
	l, err := checkpoint.ReadLatest(ctx, fs.direct)
	if err != nil || l.ID != firstID || l.Step != firstStep {
		t.Fatalf("latest.json %+v (err %v), want the earlier checkpoint %s at step %d", l, err, firstID, firstStep)
	}
	j, err := journal.Read(ctx, fs.direct, "")
	if err != nil {
		t.Fatal(err)
	}
	failedInterruption := false
	for _, in := range j.Interruptions {
		failedInterruption = failedInterruption || !in.CommitOK
	}
	if j.Stats.Failures < 1 && !failedInterruption {
		t.Fatalf("journal does not record the failed commit: stats %+v, interruptions %+v", j.Stats, j.Interruptions)
	}
	r, err := restore.Checkpoint(ctx, fs.direct, filepath.Join(dir, "check"), restore.Options{})
	if err != nil || r.Manifest.ID != firstID {
		t.Fatalf("restore: %v, got %v, want %s", err, r, firstID)
	}
}
