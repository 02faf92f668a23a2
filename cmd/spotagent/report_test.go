package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"

	"github.com/spotagent/spotagent/internal/render"
)

func TestWriteReport(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	end, blocked := t0.Add(time.Hour), 36.0
	j := &checkpoint.Journal{Sessions: []checkpoint.Session{{Start: t0, End: &end, BlockedSeconds: &blocked}}}
	g, err := checkpoint.Account(j, time.Now())
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
