package simulate

import (
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/fleet"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// PriorCell is one cloud × instance type × zone with its true rate.
type PriorCell struct {
	Name string
	Rate float64 // interruptions per hour
}

// PriorConfig compares the prior a new run's scheduler starts from: the
// flat --interruption-rate against the fleet's observed rate for the run's
// cell (fleet.PriorFor), over the first Duration of new runs.
type PriorConfig struct {
	Cells      []PriorCell
	FleetHours float64 // machine hours the fleet has seen in each cell before
	Flat       float64 // --interruption-rate
	Notices    []float64
	Runs       int // new runs per cell and notice fraction
	Duration   time.Duration
	Delta      time.Duration
	Upload     time.Duration
	Restart    time.Duration
	Seed       uint64
}

// publishedRates are the per-GPU spot interruption rates of issue 29
// (0.8 %/h V100, 2.3 %/h A100, 4.1 %/h H100), each in a region at that rate
// and in one 3× higher.
func publishedRates() []PriorCell {
	var cs []PriorCell
	for _, g := range []struct {
		name string
		rate float64
	}{{"V100", 0.008}, {"A100", 0.023}, {"H100", 0.041}} {
		cs = append(cs, PriorCell{g.name + " region 1×", g.rate}, PriorCell{g.name + " region 3×", 3 * g.rate})
	}
	return cs
}

// defaultPriorConfig is the comparison of docs/frequency.md.
func defaultPriorConfig() PriorConfig {
	return PriorConfig{
		Cells: publishedRates(), FleetHours: 500, Flat: schedule.DefaultInterruptionRate,
		Notices: []float64{0, 0.9}, Runs: 2000, Duration: 24 * time.Hour,
		Delta: 30 * time.Second, Upload: time.Minute, Restart: 5 * time.Minute, Seed: 1,
	}
}

// PriorRow is one cell and notice fraction: the first Duration of new
// runs with each prior, on the same traces.
type PriorRow struct {
	Cell      PriorCell
	Notice    float64
	FleetRate float64 // mean of the learned rates over the runs
	Flat      Result  // --interruption-rate
	RateOnly  Result  // the fleet's rate as --interruption-rate
	Fleet     Result  // the fleet's experience as history (fleet.Prior.Seed)
}

// comparePriors runs c: for each new run, a fleet history of FleetHours in
// the run's cell is drawn at the true rate (so the learned prior carries
// the sampling error a real fleet's has), the prior is
// fleet.PriorRate(flat, interruptions, hours), and the run's first
// Duration is simulated with the adaptive scheduler under the flat, the
// learned and the true rate as its prior.
func comparePriors(c PriorConfig) []PriorRow {
	var rows []PriorRow
	for ci, cell := range c.Cells {
		for ni, ns := range c.Notices {
			row := PriorRow{Cell: cell, Notice: ns}
			p := Params{Delta: c.Delta, Restart: c.Restart, Upload: c.Upload, Duration: c.Duration,
				Min: schedule.DefaultMinInterval, Max: schedule.DefaultMaxInterval}
			rng := rand.New(rand.NewPCG(c.Seed, uint64(ci*16+ni)))
			var sum float64
			for i := range c.Runs {
				pr := fleet.Prior{Source: "zone", Hours: c.FleetHours, Interruptions: poisson(rng, cell.Rate*c.FleetHours)}
				for range pr.Interruptions {
					if rng.Float64() < ns {
						pr.NoticeCommits++
					}
				}
				pr.Rate = fleet.PriorRate(c.Flat, pr.Interruptions, pr.Hours)
				sum += pr.Rate
				tr := SyntheticTrace(SynthConfig{Rate: cell.Rate, Duration: c.Duration, NoticeSuccess: ns,
					Lead: Lead(c.Delta, c.Upload), Seed: c.Seed*1_000_003 + uint64(ci*1000+ni)*100_000 + uint64(i)})
				for _, v := range []struct {
					rate float64
					hist schedule.History
					r    *Result
				}{{c.Flat, schedule.History{}, &row.Flat}, {pr.Rate, schedule.History{}, &row.RateOnly},
					{c.Flat, pr.Seed(schedule.History{}), &row.Fleet}} {
					p.PriorRate, p.History = v.rate, v.hist
					v.r.Add(Simulate(tr, Policy{Name: "adaptive"}, p))
				}
			}
			row.FleetRate = sum / float64(c.Runs)
			rows = append(rows, row)
		}
	}
	return rows
}

// poisson draws a Poisson variate by counting exponential gaps.
func poisson(rng *rand.Rand, mean float64) int {
	n := 0
	for t := rng.ExpFloat64(); t < mean; t += rng.ExpFloat64() {
		n++
	}
	return n
}

// writePriors prints rows as the table of docs/frequency.md.
func writePriors(w io.Writer, c PriorConfig, rows []PriorRow) error {
	fmt.Fprintf(w, "first %s of %d new runs per row; fleet history %.0f machine hours per cell; flat prior %.3g/h; δ %s, upload %s, restart %s\n",
		fmtDur(c.Duration), c.Runs, c.FleetHours, c.Flat, fmtDur(c.Delta), fmtDur(c.Upload), fmtDur(c.Restart))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "cell\ttrue rate/h\tnotices committed\tfleet rate/h (mean)\twaste: flat prior\tfleet rate only\tfleet (rate + notices)\tchange vs flat\t")
	var flat, ro, fl Result
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.3f\t%.0f %%\t%.4f\t%.3f %%\t%.3f %%\t%.3f %%\t%+.0f %%\t\n", r.Cell.Name, r.Cell.Rate, 100*r.Notice, r.FleetRate,
			r.Flat.Waste(), r.RateOnly.Waste(), r.Fleet.Waste(), 100*(r.Fleet.Waste()/r.Flat.Waste()-1))
		flat.Add(r.Flat)
		ro.Add(r.RateOnly)
		fl.Add(r.Fleet)
	}
	fmt.Fprintf(tw, "all rows\t\t\t\t%.3f %%\t%.3f %%\t%.3f %%\t%+.0f %%\t\n", flat.Waste(), ro.Waste(), fl.Waste(), 100*(fl.Waste()/flat.Waste()-1))
	return tw.Flush()
}
