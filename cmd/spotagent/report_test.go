package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/render"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

func TestWriteReport(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	end, blocked := t0.Add(time.Hour), 36.0
	j := &journal.Journal{Sessions: []journal.Session{{Start: t0, End: &end, BlockedSeconds: &blocked}}}
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := render.Report(&b, j, g, nil, "", nil, 1.5, 4, "table"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"PRODUCTIVE", "goodput 99.0 %", "no interruptions", "spend 1.50", "saving"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, b.String())
		}
	}
	b.Reset()
	if err := render.Report(&b, j, g, nil, "", nil, 1.5, 0, "json"); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Ratio   float64            `json:"goodput_ratio"`
		Seconds map[string]float64 `json:"seconds"`
		Money   struct{ Spend float64 }
	}
	if err := json.Unmarshal([]byte(b.String()), &out); err != nil || out.Ratio < 0.989 || out.Seconds["blocked"] != 36 || out.Money.Spend != 1.5 {
		t.Fatalf("json %+v, err %v:\n%s", out, err, b.String())
	}
}

// TestReport_AdviceSaysWhoseInterval (review, item 4): report labelled
// its own --interval default "(current)", as if the run had used it; the
// journal does not record the run's interval. The row is now "report's
// --interval", with a note naming the default when --interval was not
// given, and none when it was.
func TestReport_AdviceSaysWhoseInterval(t *testing.T) {
	_, store := testStore(t, sampleJournal())
	for _, tc := range []struct {
		args     []string
		row      string
		wantNote bool
	}{
		{nil, "--interval auto (report's --interval)", true},
		{[]string{"--interval", "10s"}, "--interval 10s (report's --interval)", false},
	} {
		args := append([]string{"report", "--store", store, "--advice-runs", "5", "--advice-horizon", "24h"}, tc.args...)
		code, out, errOut := cli(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errOut)
		}
		if strings.Contains(out, "(current)") || !strings.Contains(out, tc.row) {
			t.Errorf("%v: advice rows do not say %q (nor never \"(current)\"):\n%s", tc.args, tc.row, out)
		}
		if got := strings.Contains(out, "does not record its --interval"); got != tc.wantNote {
			t.Errorf("%v: note shown %v, want %v:\n%s", tc.args, got, tc.wantNote, out)
		}
	}
}

// TestReport_UnprotectedIsNoGoodput: `spotagent report` on the journal of
// a trainer that never connected and finished on its own (exit 0): the
// session pkg/supervisor TestAgent_NeverConnectedFinishedIsUnprotected
// has the real agent write (finished, its trainer's time unprotected;
// here the 6 s of 120 steps of 50 ms). Its time is unprotected, not
// goodput (before, 100 %), in the JSON and in the table, which says why.
// (The end-to-end TestSilence_NeverConnectsFinishes was cut in #49.)
func TestReport_UnprotectedIsNoGoodput(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	end, zero, blocked, unprotected := t0.Add(6200*time.Millisecond), 0, 0.0, 6.0
	dir := filepath.Join(t.TempDir(), "store")
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	putJournal(t, st, &journal.Journal{Format: journal.Format, RunID: "silent", Sessions: []journal.Session{{
		ID: "s1", Start: t0, End: &end, ExitCode: &zero, BlockedSeconds: &blocked, UnprotectedSeconds: &unprotected, Finished: true}}})
	code, out, errOut := cli(t, "report", "--store", "file://"+dir, "--format", "json", "--advice-runs", "0")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, errOut)
	}
	var r struct {
		Wall    float64            `json:"wall_seconds"`
		Seconds map[string]float64 `json:"seconds"`
		Ratio   float64            `json:"goodput_ratio"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("report json: %v\n%s", err, out)
	}
	if got := r.Seconds["unprotected"]; got != unprotected {
		t.Fatalf("report: %.1f s unprotected, want the trainer's %.0f s: %v", got, unprotected, r.Seconds)
	}
	if got := r.Seconds["productive"]; got > r.Wall-unprotected+0.01 || r.Ratio > 0.05 {
		t.Fatalf("report: %.1f s productive of %.1f s wall (goodput %.2f), want the unprotected time left out: %v", got, r.Wall, r.Ratio, r.Seconds)
	}
	code, out, errOut = cli(t, "report", "--store", "file://"+dir, "--advice-runs", "0")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, errOut)
	}
	for _, w := range []string{"UNPROTECTED", "unprotected 6s: the trainer ran without a connection to the agent", "SPOTAGENT_SOCKET", "goodput 3.2 %"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}

// TestReport_ThreeSessionsJournal: `spotagent report --format json` on a
// real run's journal (pkg/checkpoint/testdata/journal_3sessions.json: the
// example trainer through two spot notices, each followed by a new
// `spotagent run` that restored, then a session that completed): the
// buckets sum to the wall time, two interruptions with committed notice
// checkpoints, two restores, three sessions, restore, between-machines
// and blocked time, nothing missing, and advice calibrated on both
// notices. Damaged copies (a garbled session end; the journal cut in the
// middle) still report what they can, name what is missing and exit 1.
// TestDocs_ReportExample holds the table of the same journal;
// pkg/supervisor TestAgent_ThreeSessionsAccounted has real agents write
// such a journal. (The end-to-end TestGoodput_ThreeSessions was cut in
// #49.)
func TestReport_ThreeSessionsJournal(t *testing.T) {
	body, err := os.ReadFile("../../pkg/checkpoint/testdata/journal_3sessions.json")
	if err != nil {
		t.Fatal(err)
	}
	type report struct {
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
	reportOf := func(body string, args ...string) (int, report, string) {
		t.Helper()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "journal.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, append([]string{"report", "--store", "file://" + dir, "--format", "json"}, args...)...)
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("report json: %v\n%s", err, out)
		}
		return code, r, errOut
	}
	code, r, errOut := reportOf(string(body), "--interval", "2s", "--advice-runs", "5", "--advice-horizon", "24h")
	if code != 0 {
		t.Fatalf("report exit %d: %s", code, errOut)
	}
	var sum float64
	for _, s := range r.Seconds {
		sum += s
	}
	if r.Wall <= 0 || math.Abs(sum-r.Wall) > 0.01*r.Wall {
		t.Fatalf("buckets sum to %.3f s, wall %.3f s: want within 1 %%: %v", sum, r.Wall, r.Seconds)
	}
	if r.Interruptions != 2 || r.NoticeCommits != 2 || r.Restores != 2 || len(r.Sessions) != 3 {
		t.Fatalf("interruptions %d (notice committed %d), restores %d, sessions %d: want 2, 2, 2, 3",
			r.Interruptions, r.NoticeCommits, r.Restores, len(r.Sessions))
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

	var raw struct {
		Sessions []struct {
			End string `json:"end"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(body, &raw); err != nil || len(raw.Sessions) != 3 {
		t.Fatalf("journal: %v", err)
	}
	for _, c := range []struct {
		name, body, want string
	}{
		{"garbled end", strings.Replace(string(body), `"end": "`+raw.Sessions[1].End+`"`, `"end": "yesterday"`, 1), "sessions[1].end unreadable"},
		{"truncated", string(body[:bytes.Index(body, []byte(`"interruptions"`))+80]), "journal unreadable from byte"},
	} {
		if c.body == string(body) {
			t.Fatalf("%s: the journal was not changed", c.name)
		}
		code, r, errOut := reportOf(c.body, "--advice-runs", "0")
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Fatalf("%s: exit %d, stderr %q: want 1 naming %q", c.name, code, errOut, c.want)
		}
		if len(r.Sessions) != 3 || !strings.Contains(strings.Join(r.Missing, "\n"), c.want) {
			t.Fatalf("%s: %d sessions, missing %q: want 3, naming %q", c.name, len(r.Sessions), r.Missing, c.want)
		}
	}
}
