package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// goodputArgs: a file store, the fake AWS metadata service, a short fixed
// interval so that sessions take periodic checkpoints too.
func goodputArgs(dir string, fk *fake.AWS) []string {
	return []string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "goodput",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--cloud", "aws", "--aws-imds-endpoint", fk.URL(), "--poll-interval", "100ms",
		"--interval", "2s", "--log-level", "info"}
}

// goodputReport is the part of `spotagent report --format json` checked here.
type goodputReport struct {
	Wall          float64            `json:"wall_seconds"`
	Seconds       map[string]float64 `json:"seconds"`
	Interruptions int                `json:"interruptions"`
	NoticeCommits int                `json:"notice_commits"`
	Restores      int                `json:"restores"`
	Sessions      []json.RawMessage  `json:"sessions"`
	Missing       []string           `json:"missing"`
	Advice        *struct {
		Recommended string `json:"recommended"`
		Calibration struct {
			Interruptions   int `json:"interruptions"`
			NoticeCommitted int `json:"notice_committed"`
		} `json:"calibration"`
		Waste        float64 `json:"recommended_waste_percent"`
		CurrentWaste float64 `json:"current_waste_percent"`
	} `json:"advice"`
}

// runReport runs spotagent report and returns its stdout, stderr and exit code.
func runReport(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), agentBin(t), append([]string{"report"}, args...)...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func parseReport(t *testing.T, out string) goodputReport {
	t.Helper()
	var r goodputReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("report json: %v\n%s", err, out)
	}
	return r
}

// TestGoodput_ThreeSessions: one run through two spot notices (each
// followed by a new spotagent run on the same store, which restores) and
// a session that completes. The report's buckets sum to the wall time,
// it counts two interruptions with committed notice checkpoints and two
// restores, and it advises; a damaged copy of the journal still reports
// what it can and names what is missing. GOODPUT_JOURNAL_OUT=path keeps
// the journal (pkg/checkpoint/testdata/journal_3sessions.json).
func TestGoodput_ThreeSessions(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	trainer := []string{"--", python, "python/examples/train.py", "--steps", "1500", "--step-time", "0.01"}
	for i := range 2 {
		fk := fake.NewAWS(fake.AWSOptions{})
		t.Cleanup(fk.Close)
		p := start(t, nil, append(goodputArgs(dir, fk), trainer...)...)
		from := 0
		if i == 0 {
			p.waitLine(`starting fresh`, 2*time.Minute)
		} else {
			from = atoi(t, p.waitLine(`resuming from step (\d+) `, 2*time.Minute)[1])
		}
		// Train a few seconds (periodic checkpoints at 2 s), then the notice.
		p.waitLine(fmt.Sprintf(`^step %d `, (from/25+16)*25), 2*time.Minute)
		fk.Terminate("terminate", time.Now().Add(2*time.Minute))
		p.waitLine(`interruption checkpoint committed`, time.Minute)
		if code := p.wait(time.Minute); code != exitInterrupted {
			t.Fatalf("session %d exit code %d, want %d", i+1, code, exitInterrupted)
		}
	}
	fk := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(fk.Close)
	last := start(t, nil, append(goodputArgs(dir, fk), trainer...)...)
	last.waitLine(`resuming from step`, 2*time.Minute)
	last.waitLine(`finished 1500 steps`, 2*time.Minute)
	if code := last.wait(time.Minute); code != 0 {
		t.Fatalf("last session exit code %d", code)
	}
	store := "file://" + filepath.Join(dir, "store")
	jpath := filepath.Join(dir, "store", "journal.json")
	if p := os.Getenv("GOODPUT_JOURNAL_OUT"); p != "" {
		if err := os.WriteFile(p, readFile(t, jpath), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	out, stderr, code := runReport(t, nil, "--store", store, "--format", "json", "--interval", "2s", "--advice-runs", "30")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, stderr)
	}
	r := parseReport(t, out)
	var sum float64
	for _, s := range r.Seconds {
		sum += s
	}
	if r.Wall <= 0 || math.Abs(sum-r.Wall) > 0.01*r.Wall {
		t.Fatalf("buckets sum to %.3f s, wall %.3f s: want within 1 %%\n%s", sum, r.Wall, out)
	}
	if r.Interruptions != 2 || r.NoticeCommits != 2 || r.Restores != 2 || len(r.Sessions) != 3 {
		t.Fatalf("interruptions %d (notice committed %d), restores %d, sessions %d: want 2, 2, 2, 3\n%s",
			r.Interruptions, r.NoticeCommits, r.Restores, len(r.Sessions), out)
	}
	if r.Seconds["restore"] <= 0 || r.Seconds["between"] <= 0 || r.Seconds["blocked"] <= 0 {
		t.Fatalf("restore %v s, between %v s, blocked %v s: want all > 0", r.Seconds["restore"], r.Seconds["between"], r.Seconds["blocked"])
	}
	if len(r.Missing) != 0 {
		t.Fatalf("complete journal reported missing %q", r.Missing)
	}
	if a := r.Advice; a == nil || a.Calibration.Interruptions != 2 || a.Calibration.NoticeCommitted != 2 || a.Recommended == "" || a.Waste > a.CurrentWaste {
		t.Fatalf("advice %+v", a)
	}
	table, _, code := runReport(t, nil, "--store", store, "--advice-runs", "20")
	if code != 0 || !strings.Contains(table, "2 interruption(s), 2 with the notice checkpoint committed") || !strings.Contains(table, "recommended: --interval") {
		t.Fatalf("table (exit %d):\n%s", code, table)
	}

	// Damaged copies of the journal: a garbled session end, then a journal
	// cut in the middle. Each reports what it can, names what is missing,
	// and exits 1.
	body := string(readFile(t, jpath))
	var raw struct {
		Sessions []struct {
			End string `json:"end"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil || len(raw.Sessions) != 3 {
		t.Fatalf("journal: %v", err)
	}
	for _, c := range []struct {
		name, body, want string
		sessions         int
	}{
		{"garbled end", strings.Replace(body, `"end": "`+raw.Sessions[1].End+`"`, `"end": "yesterday"`, 1), "sessions[1].end unreadable", 3},
		{"truncated", body[:strings.Index(body, `"interruptions"`)+80], "journal unreadable from byte", 3},
	} {
		if c.body == body {
			t.Fatalf("%s: the journal was not changed", c.name)
		}
		dd := testutil.ShortDir(t)
		if err := os.MkdirAll(filepath.Join(dd, "store"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dd, "store", "journal.json"), []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		out, stderr, code := runReport(t, nil, "--store", "file://"+filepath.Join(dd, "store"), "--format", "json", "--advice-runs", "20")
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Fatalf("%s: exit %d, stderr %q: want 1 naming %q", c.name, code, stderr, c.want)
		}
		r := parseReport(t, out)
		if len(r.Sessions) != c.sessions || !strings.Contains(strings.Join(r.Missing, "\n"), c.want) {
			t.Fatalf("%s: %d sessions, missing %q", c.name, len(r.Sessions), r.Missing)
		}
		t.Logf("%s: %s", c.name, strings.TrimSpace(stderr))
	}
}
