package integration

import (
	"context"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// TestCrash_AgentRestart kills a real `spotagent run` (SIGKILL, and its
// trainer's process group, as a machine loss would) while it uploads a
// periodic checkpoint, so that a temp file (file store) or an incomplete
// multipart upload (S3) is left behind; a restarted `spotagent run` must
// remove it before it restores, resume from the newest committed step,
// and commit again.
func TestCrash_AgentRestart(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	srv := startS3(t)
	for _, backend := range []string{"file", "s3"} {
		t.Run(backend, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			store, root := "file://"+filepath.Join(dir, "store"), filepath.Join(dir, "store")
			var env []string
			var proxy *faultproxy.Proxy
			if backend == "s3" {
				// Uploads slowed to 4 MiB/s, so one is surely in flight.
				proxy = faultproxy.New(t, srv.Endpoint)
				store, root = "s3://"+srv.Bucket+"/restart", srv.Bucket
				env = append(srv.Env(), "AWS_ENDPOINT_URL_S3="+proxy.URL)
			}
			st, err := all.Open(context.Background(), store, all.Options{S3Endpoint: srv.Endpoint})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			trainer := []string{"--", python, "python/examples/train.py", "--steps", "1000000", "--step-time", "0.01",
				"--save-bytes", strconv.Itoa(12 << 20)}
			args := append(agentArgs(dir, store, "--interval", "1s", "--s3-part-size", strconv.Itoa(5<<20)), trainer...)
			a := start(t, env, args...)
			pid := atoi(t, a.waitLine(`trainer started.*"pid": ?(\d+)`, time.Minute)[1])
			t.Cleanup(func() { killGroup(pid) })
			committed := atoi(t, a.waitLine(`checkpoint committed.*"step": ?(\d+)`, 2*time.Minute)[1])
			if proxy != nil {
				proxy.Set(faultproxy.Fault{Mode: faultproxy.Slow, Rate: 4 << 20})
			}
			ctx := context.Background()
			// The agent is stopped (SIGSTOP) while the store is looked at,
			// so that the upload seen cannot end between the look and the
			// kill (on a loaded machine the test can be descheduled there for
			// longer than a 12 MiB upload to a file store takes).
			testutil.WaitWithin(t, "an upload in flight", 2*time.Minute, func() bool {
				a.signal(syscall.SIGSTOP)
				if n, err := leftovers(ctx, st, root); err == nil && n > 0 {
					return true
				}
				a.signal(syscall.SIGCONT)
				return false
			})
			a.signal(syscall.SIGKILL)
			killGroup(pid)
			a.wait(time.Minute)
			// The newest step the killed agent committed, from its log.
			for _, m := range regexpAll(a.output(), `checkpoint committed.*"step": ?(\d+)`) {
				committed = max(committed, atoi(t, m[1]))
			}
			crashed, _ := leftoverNames(ctx, st, root)
			if len(crashed) == 0 {
				t.Fatal("the kill left nothing behind: the test would not test cleanup")
			}
			if proxy != nil {
				proxy.Clear()
			}

			// SIGTERM's checkpoint (12 MiB) is this session's proof that
			// it commits again, not a race with a deadline: the in-process
			// S3 server of this race-built test binary took 48 s for one
			// on a loaded machine, past the default 25 s grace.
			b := start(t, env, append(agentArgs(dir, store, "--interval", "1h", "--term-grace", "3m"), trainer...)...)
			got := atoi(t, b.waitLine(`resuming from step (\d+)`, 2*time.Minute)[1])
			if got < committed {
				t.Fatalf("resumed from step %d, but step %d was committed", got, committed)
			}
			// What the crash left must be gone (a Put of the new session,
			// such as the journal's, may be in flight: that is not a leftover).
			now, err := leftoverNames(ctx, st, root)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range now {
				if slices.Contains(crashed, n) {
					t.Fatalf("after the restart %q, left by the crash, remains: the agent does not clean up at start", n)
				}
			}
			b.signal(syscall.SIGTERM)
			last := atoi(t, b.waitLine(`checkpoint committed.*"step": ?(\d+)`, 4*time.Minute)[1])
			if code := b.wait(time.Minute); code != exitInterrupted {
				t.Fatalf("restarted agent exit code %d, want %d (stopped by SIGTERM)", code, exitInterrupted)
			}
			if l, err := checkpoint.ReadLatest(ctx, st); err != nil || l.Step != int64(last) || last <= got {
				t.Fatalf("latest.json %+v (err %v), want step %d > resumed step %d", l, err, last, got)
			}
		})
	}
}

func regexpAll(s, re string) [][]string {
	return regexp.MustCompile(re).FindAllStringSubmatch(s, -1)
}
