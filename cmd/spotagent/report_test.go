package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
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
	if err := writeReport(&b, j, g, nil, nil, 1.5, 4, "table"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"PRODUCTIVE", "goodput 99.0 %", "no interruptions", "spend 1.50", "saving"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, b.String())
		}
	}
	b.Reset()
	if err := writeReport(&b, j, g, nil, nil, 1.5, 0, "json"); err != nil {
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
