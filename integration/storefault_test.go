package integration

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// faultStores is a store reached through a fault proxy and the same store
// reached directly (to check what landed), for S3 or GCS.
type faultStores struct {
	proxy          *faultproxy.Proxy
	faulty, direct cloud.Store
	uri            string
	env            []string // for a spotagent process: through the proxy
}

func newFaultStores(t *testing.T, backend, prefix string) *faultStores {
	t.Helper()
	ctx := context.Background()
	fs := &faultStores{}
	open := func(uri string, opts all.Options, gcsHost string) cloud.Store {
		st, err := openStoreVia(ctx, uri, opts, gcsHost)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	switch backend {
	case "s3":
		srv := startS3(t)
		fs.proxy = faultproxy.New(t, srv.Endpoint)
		fs.uri = "s3://" + srv.Bucket + "/" + prefix
		fs.faulty = open(fs.uri, all.Options{S3Endpoint: fs.proxy.URL, S3PartSize: 5 << 20}, "")
		fs.direct = open(fs.uri, all.Options{S3Endpoint: srv.Endpoint}, "")
		fs.env = append(srv.Env(), "AWS_ENDPOINT_URL_S3="+fs.proxy.URL)
	case "gcs":
		srv, err := gcstest.Start("spotagent-test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		fs.proxy = faultproxy.New(t, "http://"+srv.Host)
		fs.uri = "gs://" + srv.Bucket + "/" + prefix
		// The library reads STORAGE_EMULATOR_HOST when the client is made.
		fs.faulty = open(fs.uri, all.Options{GCSChunkSize: 1 << 20}, fs.proxy.Host)
		fs.direct = open(fs.uri, all.Options{}, srv.Host)
		fs.env = []string{"STORAGE_EMULATOR_HOST=" + fs.proxy.Host}
	default:
		t.Fatalf("backend %q", backend)
	}
	return fs
}

// dataReads records the checkpoint objects read from a faultStores store
// through its proxy: every GET under checkpoints/ but those whose path ends
// in skip (metadata), once start was called. It is a fault that never
// fires: its Match sees every request.
type dataReads struct {
	mu       sync.Mutex
	counting bool
	names    []string // each object's name (its key's last element), in order
}

func (fs *faultStores) recordDataReads(skip string) *dataReads {
	d := &dataReads{}
	fs.proxy.Set(faultproxy.Fault{Mode: faultproxy.Stall, Stall: time.Minute, Match: func(r *http.Request) bool {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/checkpoints/") && !strings.HasSuffix(r.URL.Path, skip) {
			d.mu.Lock()
			if d.counting {
				d.names = append(d.names, r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
			}
			d.mu.Unlock()
		}
		return false
	}})
	return d
}

// start records from now on, forgetting what came before.
func (d *dataReads) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counting, d.names = true, nil
}

// read is the names recorded since start, sorted.
func (d *dataReads) read() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(slices.Values(d.names))
}

// isWrite matches requests that carry object data.
func isWrite(r *http.Request) bool { return r.Method == http.MethodPut || r.Method == http.MethodPost }

// TestStoreFault_AgentThroughFaults runs `spotagent run` with the example
// trainer against S3 and GCS behind a proxy that fails a quarter of the
// writes (500, SlowDown, resets) and slows the rest: periodic checkpoints
// still commit, the SIGTERM checkpoint commits, and a restart resumes from
// it.
func TestStoreFault_AgentThroughFaults(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	for _, backend := range []string{"s3", "gcs"} {
		t.Run(backend, func(t *testing.T) {
			fs := newFaultStores(t, backend, "agent")
			dir := testutil.ShortDir(t)
			modes := []faultproxy.Fault{
				{Mode: faultproxy.InternalError, Fraction: 0.25, Match: isWrite},
				{Mode: faultproxy.SlowDown, Fraction: 0.25, Match: isWrite},
				{Mode: faultproxy.ResetRequest, After: 32 << 10, Fraction: 0.25, Match: isWrite},
			}
			fs.proxy.Set(modes[0]) // the start's writes too
			trainer := []string{"--", python, "python/examples/train.py", "--steps", "1000000", "--step-time", "0.01",
				"--save-bytes", strconv.Itoa(3 << 20)}
			a := start(t, fs.env, append(agentArgs(dir, fs.uri, "--interval", "1s"), trainer...)...)
			// Two commits under each fault (the second requested after
			// the switch), switched while the agent runs.
			commits := 0
			for _, f := range modes {
				fs.proxy.Set(f)
				commits += 2
				a.waitLines(`checkpoint committed`, commits, 2*time.Minute)
			}
			a.signal(syscall.SIGTERM)
			// The agent's line: a periodic request pending at the signal
			// becomes the shutdown's checkpoint, and the trainer saves it
			// under the reason it was asked with (periodic).
			m := a.waitLine(`interruption checkpoint committed: stopping the trainer.*"step": (\d+)`, time.Minute)
			if code := a.wait(2 * time.Minute); code != exitInterrupted {
				t.Fatalf("agent exit code %d, want %d", code, exitInterrupted)
			}
			if s := fs.proxy.Stats(); s.Faults == 0 {
				t.Fatalf("no fault injected in %d requests", s.Requests)
			}
			if out := a.output(); strings.Contains(out, "checkpoint not committed") {
				t.Fatalf("a commit failed through retryable faults")
			}
			l, err := checkpoint.ReadLatest(context.Background(), fs.direct)
			if err != nil || l.Step != int64(atoi(t, m[1])) {
				t.Fatalf("latest.json %+v (err %v), want the shutdown checkpoint at step %s", l, err, m[1])
			}
		})
	}
}

// TestStoreFault_DownDuringInterruption: the store goes down for good
// (every connection reset) after a periodic checkpoint committed; SIGTERM's
// checkpoint cannot upload before its deadline. The agent must not spin
// (CPU well under a core while it retries), must give up at the deadline
// with "checkpoint not committed", tell the trainer (upload_failed, which
// the client logs), record the failure in the journal once the store is
// back, and leave the previous checkpoint as latest.
func TestStoreFault_DownDuringInterruption(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	fs := newFaultStores(t, "s3", "down")
	dir := testutil.ShortDir(t)
	trainer := []string{"--", python, "python/examples/train.py", "--steps", "1000000", "--step-time", "0.01",
		"--save-bytes", strconv.Itoa(6 << 20)}
	a := start(t, fs.env, append(agentArgs(dir, fs.uri, "--interval", "2s", "--term-grace", "12s", "--margin", "1s",
		"--s3-part-size", strconv.Itoa(5<<20)), trainer...)...)
	m := a.waitLine(`checkpoint committed.*"id": ?"([0-9a-f]+)".*"step": ?(\d+)`, 2*time.Minute)
	firstID, firstStep := m[1], int64(atoi(t, m[2]))
	pid := a.cmd.Process.Pid

	fs.proxy.Set(faultproxy.Fault{Mode: faultproxy.ResetRequest})
	a.signal(syscall.SIGTERM)
	// The shutdown checkpoint is a new request, or the periodic one
	// pending at the signal (then the trainer saves it as periodic).
	m = a.waitLine(`checkpoint requested.*"id": ?"([0-9a-f]+)", "reason": ?"shutdown"|`+
		`the pending periodic checkpoint becomes the interruption checkpoint.*"id": ?"([0-9a-f]+)"`, time.Minute)
	a.waitLine(`checkpoint `+m[1]+m[2]+` \(\w+\) at step`, time.Minute)
	// While the upload retries against a dead store, measure the agent's
	// CPU over a few seconds.
	cpu0, t0 := cpuTime(t, pid), time.Now()
	testutil.WaitWithin(t, "a CPU measurement window", 10*time.Second, func() bool { return time.Since(t0) >= 4*time.Second })
	cpu1, t1 := cpuTime(t, pid), time.Now()
	// (A periodic upload the shutdown cancelled may have given up: only
	// the shutdown checkpoint's own failure spoils the window.)
	if regexp.MustCompile(`checkpoint not committed.*"reason": ?"shutdown"`).MatchString(a.output()) {
		t.Fatal("the upload gave up before its deadline: the window did not measure a retrying agent")
	}
	if frac := float64(cpu1-cpu0) / float64(t1.Sub(t0)); frac > 0.20 {
		t.Fatalf("agent used %.0f%% of a core while the store was down (busy loop?)", 100*frac)
	} else {
		t.Logf("agent CPU while the store was down: %.1f%% of a core (%s over %s)", 100*frac, cpu1-cpu0, t1.Sub(t0).Round(time.Millisecond))
	}

	a.waitLine(`checkpoint not committed.*"reason": ?"shutdown"`, time.Minute)
	// upload_failed was sent: the trainer logs it ("upload failed"), or,
	// when the agent had already stopped the trainer at the deadline, the
	// agent logs that it could not deliver it.
	a.waitLine(`upload failed|"type": ?"upload_failed"`, 30*time.Second)
	fs.proxy.Clear() // back, so the journal can be saved
	a.wait(time.Minute)
	if fs.proxy.Stats().Faults == 0 {
		t.Fatal("no request reached the dead store")
	}

	ctx := context.Background()
	l, err := checkpoint.ReadLatest(ctx, fs.direct)
	if err != nil || l.ID != firstID || l.Step != firstStep {
		t.Fatalf("latest.json %+v (err %v), want the earlier checkpoint %s at step %d", l, err, firstID, firstStep)
	}
	j := readJournal(t, fs.direct)
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
	if n, err := leftovers(ctx, fs.direct, strings.SplitN(strings.TrimPrefix(fs.uri, "s3://"), "/", 2)[0]); err != nil || n != 0 {
		t.Logf("incomplete multipart uploads left after the abandoned upload: %d (err %v); the next start removes them", n, err)
	}
}
