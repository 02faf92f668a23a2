package integration

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// promiseWarning is the agent's one warning that a notice checkpoint will
// not commit within this machine's notice (pkg/supervisor/promise).
const promiseWarning = `a notice checkpoint will not commit before the machine goes`

// TestNoticePromise: a real trainer (train.py, a 1 MiB payload per
// checkpoint) under `spotagent run` on a fake GCP machine, S3 behind a
// fault proxy. Throttled to 256 KiB/s a checkpoint takes ~4 s; with
// --margin 27s GCP's 30 s notice leaves 3 s, AWS's 120 s leaves 93 s: the
// agent warns once (not after every checkpoint), and the metrics and
// `spotagent status` agree that it fits AWS's notice and not GCP's; the
// next start says so again from the journal, before any checkpoint.
// Unthrottled, with no margin, it fits both, and nothing is said (with
// 3 s left it did not on a loaded machine: the upload ran at 0.2 MB/s).
func TestNoticePromise(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	for _, tc := range []struct {
		name   string
		slow   bool
		margin string // GCP's 30 s notice less it: 3 s throttled, 30 s fast
	}{{"throttled", true, "27s"}, {"fast", false, "0s"}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultStores(t, "promise-"+tc.name)
			if tc.slow {
				fs.proxy.Set(faultproxy.Fault{Mode: faultproxy.Slow, Rate: 256 << 10})
			}
			gcp := startFake(t, "gcp")
			dir := testutil.ShortDir(t)
			maddr := freeAddr(t)
			sock := filepath.Join(dir, "a.sock")
			args := append(noticeArgs(dir, fs.uri, cloudArgs(t, "gcp", gcp.URL())...),
				"--interval", "1s", "--margin", tc.margin, "--metrics-addr", maddr,
				"--", python, "python/examples/train.py", "--steps", "1000000", "--step-time", "0.01",
				"--save-bytes", strconv.Itoa(1<<20))
			a := start(t, fs.env, args...)
			// Periodic checkpoints, a verdict after each: once the third
			// commit is logged the second was judged (the next request
			// waits for the previous commit's result).
			testutil.WaitWithin(t, "three commits", 2*time.Minute, func() bool {
				return strings.Count(a.output(), "checkpoint committed") >= 3
			})
			warnings := strings.Count(a.output(), promiseWarning)
			st := agentStatus(t, sock)
			p := st.NoticePromise
			if p == nil || p.Source != "checkpoint" || p.Bytes < 1<<20 || p.NeedSeconds <= 0 {
				t.Fatalf("status notice_promise=%+v, want this session's checkpoint of at least 1 MiB", p)
			}
			fits := map[string]bool{}
			for _, c := range p.Clouds {
				fits[c.Cloud] = c.Fits
				got := scrape(t, maddr, `spotagent_notice_checkpoint_fits{cloud="`+c.Cloud+`"}`)
				if (got == 1) != c.Fits {
					t.Errorf("metric fits{cloud=%q}=%v, status says fits=%v", c.Cloud, got, c.Fits)
				}
				if b := scrape(t, maddr, `spotagent_notice_budget_seconds{cloud="`+c.Cloud+`"}`); b != c.BudgetSeconds {
					t.Errorf("metric budget{cloud=%q}=%v, status says %v", c.Cloud, b, c.BudgetSeconds)
				}
			}
			if got := scrape(t, maddr, "spotagent_notice_checkpoint_predicted_seconds"); got <= 0 {
				t.Errorf("spotagent_notice_checkpoint_predicted_seconds=%v, want > 0", got)
			}
			if !fits["aws"] {
				t.Errorf("a %s checkpoint (%.1f s) does not fit AWS's 93 s: %+v", tc.name, p.NeedSeconds, p)
			}
			if tc.slow {
				if fits["gcp"] || p.NeedSeconds <= 3 || p.Problem == "" || len(p.Advice) == 0 {
					t.Fatalf("throttled: status %+v, want gcp not to fit (need > 3 s), with the problem and advice", p)
				}
				if warnings != 1 {
					t.Fatalf("throttled: %d warnings after two checkpoints, want exactly 1", warnings)
				}
				if !regexp.MustCompile(promiseWarning + `: checkpoint 1\.0 MiB needs ~[0-9.]+s \(at [0-9.]+ MB/s, save [0-9.]+m?s\); GCP preemption gives 30s \(3s with --margin 27s\)`).MatchString(a.output()) {
					t.Fatalf("warning does not say size, time, rate and notice:\n%s", a.output())
				}
			} else {
				if !fits["gcp"] || p.Problem != "" {
					t.Fatalf("fast: status %+v, want it to fit gcp's 30 s", p)
				}
				if warnings != 0 {
					t.Fatalf("fast: %d warnings, want none", warnings)
				}
			}
			st2 := runSpotagentTool(t, nil, "status", "--socket", sock)
			if want := "on a notice:"; !strings.Contains(st2, want) {
				t.Fatalf("spotagent status has no %q line:\n%s", want, st2)
			}
			t.Logf("spotagent status:\n%s", st2)
			a.signal(syscall.SIGTERM)
			if code := a.wait(2 * time.Minute); code != exitInterrupted {
				t.Fatalf("agent exit code %d, want %d", code, exitInterrupted)
			}
			rep := runSpotagentTool(t, fs.env, "report", "--store", fs.uri, "--margin", tc.margin, "--advice-runs", "0")
			if got := strings.Contains(rep, "NOT gcp"); got != tc.slow {
				t.Fatalf("report says NOT gcp: %v, want %v:\n%s", got, tc.slow, rep)
			}
			t.Logf("spotagent report:\n%s", rep)
			if !tc.slow {
				return
			}
			// The next start says so at once, from the journal.
			gcp2 := startFake(t, "gcp")
			args2 := append(noticeArgs(dir, fs.uri, cloudArgs(t, "gcp", gcp2.URL())...),
				"--margin", "27s", "--", python, "python/examples/train.py", "--steps", "1000000", "--step-time", "0.01")
			a2 := start(t, fs.env, args2...)
			t.Logf("%s", a2.waitLine(promiseWarning+`.*"source": ?"journal"`, 2*time.Minute)[0])
			if strings.Contains(a2.output(), "checkpoint committed") {
				t.Fatal("the start's warning came after a checkpoint, not from the journal")
			}
			a2.signal(syscall.SIGTERM)
			a2.wait(2 * time.Minute)
		})
	}
}

// agentStatus asks the agent at sock for its status (spotagent status --json).
func agentStatus(t *testing.T, sock string) supervisor.Status {
	t.Helper()
	out := runSpotagentTool(t, nil, "status", "--socket", sock, "--json")
	var st supervisor.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}
