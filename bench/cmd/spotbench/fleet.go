package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/report"

	"github.com/spotagent/spotagent/bench/internal/fleetsynth"
)

// fleetRuns is the fleet size of the fleet section (issue 29: 10,000 runs,
// `fleet` from the summary in under 5 s).
const fleetRuns = 10000

// benchFleet writes fleetRuns synthetic run journals (1–6 sessions over 3
// clouds × 4 instance types × 3 zones, Poisson interruptions, a
// latest.json each) into a file store, builds the summary with
// `spotagent fleet --recount --save-summary`, then times `spotagent fleet`
// from the summary (table and json, with a price file) and the recount.
func benchFleet(c *config, r *report.Report) error {
	root := filepath.Join(c.work, "fleet")
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	t0 := time.Now()
	if err := fleetsynth.Write(root, fleetRuns); err != nil {
		return err
	}
	logf("fleet: %d journals written in %s", fleetRuns, time.Since(t0).Round(time.Millisecond))
	prices := filepath.Join(c.work, "prices.csv")
	if err := os.WriteFile(prices, []byte(fleetsynth.Prices()), 0o644); err != nil {
		return err
	}
	run := func(args ...string) (time.Duration, error) {
		cmd := exec.Command(c.bin, append([]string{"fleet", "--store", root, "--prices", prices}, args...)...)
		var errb strings.Builder
		cmd.Stderr = &errb
		cmd.Stdout = nil // discarded: the figure is the whole command
		start := time.Now()
		err := cmd.Run()
		if err != nil {
			return 0, fmt.Errorf("spotagent fleet %v: %w: %s", args, err, errb.String())
		}
		return time.Since(start), nil
	}
	recount, err := run("--recount", "--save-summary")
	if err != nil {
		return err
	}
	st, err := os.Stat(filepath.Join(root, "fleet", "summary.gob"))
	if err != nil {
		return err
	}
	var table, js, rec []time.Duration
	for range max(c.reps, 3) {
		d, err := run()
		if err != nil {
			return err
		}
		table = append(table, d)
		if d, err = run("--format", "json"); err != nil {
			return err
		}
		js = append(js, d)
	}
	for range 2 {
		d, err := run("--recount")
		if err != nil {
			return err
		}
		rec = append(rec, d)
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d synthetic runs (1–6 sessions each on 3 clouds × 4 instance types × 3 zones, Poisson interruptions) in a file store; summary %.1f MB. Wall time of the whole `spotagent fleet` command, process start included, output discarded; median of %d.\n\n",
		fleetRuns, float64(st.Size())/1e6, len(table))
	b.WriteString("| command | median | all |\n|---|---|---|\n")
	row := func(name string, ds []time.Duration) {
		var all []string
		for _, d := range ds {
			all = append(all, d.Round(time.Millisecond).String())
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, med(ds).Round(time.Millisecond), strings.Join(all, ", "))
	}
	row("`fleet` (summary, table)", table)
	row("`fleet --format json` (summary)", js)
	row("`fleet --recount` (every journal and latest.json)", rec)
	row("`fleet --recount --save-summary` (first build)", []time.Duration{recount})
	r.Add("9. Fleet view: `spotagent fleet` over 10,000 runs (file store)", b.String())
	got := med(table)
	r.Target(report.Target{Name: "`spotagent fleet` on 10,000 runs from the summary", Want: "< 5 s",
		Got: got.Round(time.Millisecond).String(), Met: got < 5*time.Second, Margin: fmt.Sprintf("%+.2f s", 5-got.Seconds())})
	r.Command("spotagent fleet --store DIR --prices prices.csv [--format json] [--recount]")
	return nil
}
