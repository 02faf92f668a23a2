package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
)

// TestStartup_SlowStoreCancelled: the start-up restore through the fault
// proxy, against an S3 store that never answers the GET of latest.json,
// and one that serves the checkpoint's data at 100 B/s. The agent logs the
// restore's progress, and SIGTERM ends the start at once (exit 143, "start-up
// cancelled"); the trainer is never started. Before, only SIGKILL did.
func TestStartup_SlowStoreCancelled(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name  string
		fault faultproxy.Fault
		wait  string // a line that says the start is held up
	}{
		{"never-answers", faultproxy.Fault{Mode: faultproxy.Stall, Stall: 10 * time.Minute,
			Match: func(r *http.Request) bool {
				return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/latest.json")
			}}, ""},
		{"trickle", faultproxy.Fault{Mode: faultproxy.Slow, Rate: 100,
			Match: func(r *http.Request) bool {
				return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/state.bin")
			}},
			`restore progress`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultStores(t, "s3", "startup-"+tc.name)
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "state.bin"), []byte(strings.Repeat("s", 8<<10)), 0o600); err != nil {
				t.Fatal(err)
			}
			c := &commit.Committer{Store: fs.direct, RunID: "it"}
			if _, err := c.Commit(t.Context(), commit.Request{Dir: src, ID: "c1", Step: 10}); err != nil {
				t.Fatal(err)
			}
			fs.proxy.Set(tc.fault)
			dir := testutil.ShortDir(t)
			ran := filepath.Join(dir, "ran")
			// The serial start (restore, then the trainer): the overlapped
			// one starts the trainer at once (restore_overlap_test.go).
			a := start(t, append(fs.env, "AWS_EC2_METADATA_DISABLED=true"), append(agentArgs(dir, fs.uri, "--restore-serial"), "--", "/bin/sh", "-c", "touch "+ran)...)
			if tc.wait != "" {
				a.waitLine(tc.wait, time.Minute)
			} else {
				deadline := time.Now().Add(time.Minute)
				for fs.proxy.Stats().Faults == 0 {
					if time.Now().After(deadline) {
						t.Fatal("the agent never asked for latest.json")
					}
					time.Sleep(20 * time.Millisecond) // polling a condition, bounded by deadline
				}
			}
			sent := time.Now()
			a.signal(syscall.SIGTERM)
			if code := a.wait(30 * time.Second); code != 128+int(syscall.SIGTERM) {
				t.Fatalf("exit code %d after SIGTERM during the start, want 143", code)
			}
			if took := time.Since(sent); took > 10*time.Second {
				t.Fatalf("SIGTERM took %s to end the start", took)
			}
			if !strings.Contains(a.output(), "start-up cancelled by terminated") {
				t.Fatal("the output does not say the start was cancelled")
			}
			if _, err := os.Stat(ran); err == nil {
				t.Fatal("the trainer was started")
			}
		})
	}
}
