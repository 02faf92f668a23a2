package main

import (
	"encoding/json"
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
	for _, w := range []string{"UNPROTECTED", "unprotected 6s: the trainer ran with no trainer connected to the agent", "SPOTAGENT_SOCKET", "goodput 3.2 %"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}
