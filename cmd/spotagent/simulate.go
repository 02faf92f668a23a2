package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/simulate"
)

// newSimulateCmd compares checkpoint interval policies on an interruption
// trace (--trace) or synthetic ones, or prints the table of
// docs/frequency.md (--grid).
func newSimulateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "simulate",
		Short:   "compare checkpoint interval policies on an interruption trace",
		Example: "spotagent simulate --rate 0.1 --delta 45s --policies adaptive,fixed:15m",
		Args:    cobra.NoArgs,
	}
	fs := cmd.Flags()
	trace := fs.String("trace", "", "interruption trace: a run journal (journal.json) or CSV time,kind,lead_seconds (time: seconds from start or RFC 3339; kind: announced|unannounced|rebalance); empty = synthetic")
	rate := fs.Float64("rate", 0.05, "synthetic: interruptions per hour")
	duration := fs.Duration("duration", 30*24*time.Hour, "length of one run (with --trace and unset: the last event + 1h)")
	notice := fs.Float64("notice-success", 0.9, "synthetic: fraction of interruptions whose notice checkpoint commits")
	seed := fs.Uint64("seed", 1, "synthetic: first seed")
	runs := fs.Int("runs", 100, "synthetic: runs (seeds seed..seed+runs-1) summed per policy (--grid: default 200)")
	policies := fs.String("policies", "adaptive,fixed:5m,fixed:10m,fixed:15m,fixed:30m,fixed:60m", "comma-separated: adaptive, fixed:<duration>")
	delta := fs.Duration("delta", 30*time.Second, "blocking cost of one checkpoint")
	oldDelta := fs.Duration("compare-delta", 0, "also simulate the same traces at this δ, e.g. a blocking save's cost beside --delta a background save's staging time")
	restart := fs.Duration("restart", 5*time.Minute, "time from a machine's loss to training again")
	upload := fs.Duration("upload", time.Minute, "upload time of one checkpoint (background)")
	prior := fs.Float64("interruption-rate", schedule.DefaultInterruptionRate, "adaptive policy's prior interruptions per hour")
	minIv := fs.Duration("min-interval", schedule.DefaultMinInterval, "lower clamp of every policy")
	maxIv := fs.Duration("max-interval", schedule.DefaultMaxInterval, "upper clamp of every policy")
	grid := fs.Bool("grid", false, "print the docs/frequency.md table (ignores the other trace flags except seed, runs, duration, restart, upload, clamps and interruption-rate)")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "grid: parallel simulations")
	inGroup(fs, groupSynthetic, "rate", "notice-success", "seed", "runs")
	inGroup(fs, groupSchedule, "policies", "interruption-rate", "min-interval", "max-interval")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		code := simulateRun(cmd, simArgs{trace: *trace, rate: *rate, duration: *duration, notice: *notice, seed: *seed,
			runs: *runs, policies: *policies, delta: *delta, oldDelta: *oldDelta, restart: *restart, upload: *upload,
			prior: *prior, minIv: *minIv, maxIv: *maxIv, grid: *grid, workers: *workers})
		return exit(code)
	}
	return cmd
}

// simArgs are simulate's flag values.
type simArgs struct {
	trace, policies                                          string
	rate, notice, prior                                      float64
	seed                                                     uint64
	runs, workers                                            int
	duration, delta, oldDelta, restart, upload, minIv, maxIv time.Duration
	grid                                                     bool
}

func simulateRun(cmd *cobra.Command, a simArgs) int {
	fs := cmd.Flags()
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	trace, duration, seed, runs, restart, upload := &a.trace, &a.duration, &a.seed, &a.runs, &a.restart, &a.upload
	minIv, maxIv, prior, workers, grid, policies := &a.minIv, &a.maxIv, &a.prior, &a.workers, &a.grid, &a.policies
	delta, oldDelta, rate, notice := &a.delta, &a.oldDelta, &a.rate, &a.notice
	if *grid {
		g := simulate.DefaultGrid()
		g.Seed, g.Duration, g.Restart, g.Upload = *seed, *duration, *restart, *upload
		if isSet(fs, "runs") {
			g.Runs = *runs
		}
		g.Min, g.Max, g.PriorRate, g.Workers = *minIv, *maxIv, *prior, *workers
		start := time.Now()
		// About a minute of work: say how far it is, on one line of a
		// terminal, else a line per cell.
		tty := isTerminal(stderr)
		g.Progress = func(done, total int) {
			if tty {
				fmt.Fprintf(stderr, "\rgrid: %d/%d cells, %s", done, total, time.Since(start).Round(time.Second))
				if done == total {
					fmt.Fprintln(stderr)
				}
				return
			}
			fmt.Fprintf(stderr, "grid: %d/%d cells, %s\n", done, total, time.Since(start).Round(time.Second))
		}
		fmt.Fprintf(stderr, "grid: simulating %d cells, %d runs of %s per cell and policy, on %d workers\n",
			len(g.Rates)*len(g.Notices)*len(g.Deltas), g.Runs, g.Duration, max(g.Workers, 1))
		cells := simulate.RunGrid(g)
		if err := simulate.WriteGrid(stdout, g, cells); err != nil {
			fmt.Fprintln(stderr, "spotagent simulate:", err)
			return 1
		}
		fmt.Fprintf(stderr, "grid: %d cells in %s\n", len(cells), time.Since(start).Round(time.Millisecond))
		return 0
	}
	pols, err := simulate.ParsePolicies(*policies)
	if err != nil {
		fmt.Fprintln(stderr, "spotagent simulate:", err)
		return 2
	}
	p := simulate.Params{Delta: *delta, Restart: *restart, Upload: *upload, Duration: *duration,
		Min: *minIv, Max: *maxIv, PriorRate: *prior}
	var traces [][]simulate.Event
	if *trace != "" {
		evs, wall, err := readTraceFile(*trace)
		if err != nil {
			fmt.Fprintln(stderr, "spotagent simulate:", err)
			return 1
		}
		if !isSet(fs, "duration") {
			if wall > 0 {
				p.Duration = wall
			} else if len(evs) > 0 {
				p.Duration = evs[len(evs)-1].At + time.Hour
			}
		}
		traces = [][]simulate.Event{evs}
	} else {
		for i := range max(*runs, 1) {
			traces = append(traces, simulate.SyntheticTrace(simulate.SynthConfig{Rate: *rate, Duration: *duration,
				NoticeSuccess: *notice, Lead: simulate.Lead(*delta, *upload), Seed: *seed + uint64(i)}))
		}
	}
	results := make([]simulate.Result, len(pols))
	for i, pol := range pols {
		for _, tr := range traces {
			results[i].Add(simulate.Simulate(tr, pol, p))
		}
	}
	writeSimTable(stdout, pols, results, len(traces), p.Duration)
	if *oldDelta > 0 {
		q := p
		q.Delta = *oldDelta
		old := make([]simulate.Result, len(pols))
		for i, pol := range pols {
			for _, tr := range traces {
				old[i].Add(simulate.Simulate(tr, pol, q))
			}
		}
		fmt.Fprintf(stdout, "\nthe same traces at δ=%s (above: δ=%s)\n", q.Delta, p.Delta)
		writeSimTable(stdout, pols, old, len(traces), q.Duration)
	}
	return 0
}

// readTraceFile reads a CSV trace, or a run journal (journal.json, JSON);
// for a journal it also returns the run's wall time.
func readTraceFile(path string) ([]simulate.Event, time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("open trace: %w", err)
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		var j journal.Journal
		if err := json.Unmarshal(t, &j); err != nil {
			return nil, 0, fmt.Errorf("read journal %s: %w", path, err)
		}
		return simulate.TraceFromJournal(&j)
	}
	evs, err := simulate.ReadTrace(bytes.NewReader(b))
	return evs, 0, err
}

func writeSimTable(w io.Writer, pols []simulate.Policy, rs []simulate.Result, runs int, d time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tcheckpoints\tinterruptions\toverhead %%\tlost %%\trestart %%\twaste %%\t\n")
	for i, r := range rs {
		pct := func(x time.Duration) float64 { return 100 * float64(x) / float64(r.Useful) }
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t\n", pols[i].Name, r.Checkpoints, r.Interruptions,
			pct(r.Overhead), pct(r.Lost), pct(r.Restart), r.Waste())
	}
	tw.Flush()
	fmt.Fprintf(w, "%d run(s) of %s; percentages of useful work\n", runs, d)
}
