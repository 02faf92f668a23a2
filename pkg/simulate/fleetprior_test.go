package simulate

import (
	"os"
	"strings"
	"testing"
)

// The fleet's observed rate as a new run's prior wastes less of the run's
// first day than the flat --interruption-rate, over the published per-GPU
// rates and a 3× regional spread (docs/frequency.md). SPOTAGENT_PRIOR_TABLE=1
// prints the full table (2,000 runs per row) as the doc shows it.
func TestComparePriors(t *testing.T) {
	c := defaultPriorConfig()
	if os.Getenv("SPOTAGENT_PRIOR_TABLE") == "" {
		c.Runs = 300
	}
	rows := comparePriors(c)
	var b strings.Builder
	if err := writePriors(&b, c, rows); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	var flat, fleet Result
	for _, r := range rows {
		flat.Add(r.Flat)
		fleet.Add(r.Fleet)
		// No row pays for the prior: at most noise (2,000 runs: +0.2 % worst).
		if r.Fleet.Waste() > 1.05*r.Flat.Waste() {
			t.Errorf("%s, notices %.0f %%: fleet prior waste %.3f %% > 1.05 × flat %.3f %%", r.Cell.Name, 100*r.Notice, r.Fleet.Waste(), r.Flat.Waste())
		}
	}
	if fleet.Waste() > 0.9*flat.Waste() {
		t.Errorf("fleet prior waste %.3f %% over all rows, want ≤ 0.9 × flat prior %.3f %%", fleet.Waste(), flat.Waste())
	}
}
