package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// fleetRuns is the fleet size of the fleet section (issue 29: 10,000 runs,
// `fleet` from the summary in under 5 s).
const fleetRuns = 10000

// benchFleet writes fleetRuns synthetic run journals (1–6 sessions over 3
// clouds × 4 instance types × 3 zones, Poisson interruptions, a
// latest.json each) into a file store, builds the summary with
// `spotagent fleet --recount --save-summary`, then times `spotagent fleet`
// from the summary (table and json, with a price file) and the recount.
func benchFleet(c *config, r *report) error {
	root := filepath.Join(c.work, "fleet")
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	t0 := time.Now()
	if err := writeSyntheticFleet(root, fleetRuns); err != nil {
		return err
	}
	logf("fleet: %d journals written in %s", fleetRuns, time.Since(t0).Round(time.Millisecond))
	prices := filepath.Join(c.work, "prices.csv")
	if err := os.WriteFile(prices, []byte(syntheticPrices()), 0o644); err != nil {
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
	r.add("9. Fleet view: `spotagent fleet` over 10,000 runs (file store)", b.String())
	got := med(table)
	r.target(target{name: "`spotagent fleet` on 10,000 runs from the summary", want: "< 5 s",
		got: got.Round(time.Millisecond).String(), met: got < 5*time.Second, margin: fmt.Sprintf("%+.2f s", 5-got.Seconds())})
	r.command("spotagent fleet --store DIR --prices prices.csv [--format json] [--recount]")
	return nil
}

var (
	fleetClouds = map[string][]string{
		"aws":   {"us-east-1a", "us-east-1b", "us-west-2a"},
		"gcp":   {"us-central1-a", "europe-west4-a", "asia-east1-b"},
		"azure": {"eastus-1", "westeurope-2", "southcentralus-3"},
	}
	fleetTypes = map[string][]string{
		"aws":   {"p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "g5.xlarge"},
		"gcp":   {"n1-standard-8-v100", "a2-highgpu-1g", "a3-highgpu-8g", "g2-standard-4"},
		"azure": {"Standard_NC6s_v3", "Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5"},
	}
)

func syntheticPrices() string {
	var b strings.Builder
	b.WriteString("instance_type,spot,on_demand\n")
	i := 0
	for _, ts := range fleetTypes {
		for _, t := range ts {
			i++
			fmt.Fprintf(&b, "%s,%.2f,%.2f\n", t, 0.5*float64(i), 1.6*float64(i))
		}
	}
	return b.String()
}

// writeSyntheticFleet writes n runs' journal.json and latest.json under root.
func writeSyntheticFleet(root string, n int) error {
	rng := rand.New(rand.NewPCG(29, 10000))
	base := time.Now().Add(-60 * 24 * time.Hour).UTC().Truncate(time.Second)
	for i := range n {
		j, step, t := syntheticJournal(rng, i, base)
		dir := filepath.Join(root, j.RunID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		b, err := json.MarshalIndent(j, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, checkpoint.JournalKey), b, 0o644); err != nil {
			return err
		}
		l, _ := json.Marshal(checkpoint.Latest{Manifest: checkpoint.Prefix(step, "c") + "manifest.json", Step: step, ID: "c", Updated: t})
		if err := os.WriteFile(filepath.Join(dir, checkpoint.LatestKey), l, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// syntheticJournal is run i of a synthetic fleet: 1–6 sessions of one
// instance type over its cloud's zones, Poisson interruptions, 85 % of
// them with the notice checkpoint committed. It returns the journal, the
// newest step and the end of its last session.
func syntheticJournal(rng *rand.Rand, i int, base time.Time) (*journal.Journal, int64, time.Time) {
	clouds := []string{"aws", "gcp", "azure"}
	id := fmt.Sprintf("run-%06d", i)
	cl := clouds[rng.IntN(3)]
	typ := fleetTypes[cl][rng.IntN(4)]
	rate := 0.01 * float64(1+rng.IntN(5)) // per hour
	j := &journal.Journal{Format: journal.Format, RunID: id}
	t := base.Add(time.Duration(rng.Int64N(int64(55 * 24 * time.Hour))))
	var step int64
	for s := range 1 + rng.IntN(6) {
		zone := fleetClouds[cl][rng.IntN(3)]
		m := checkpoint.Machine{Cloud: cl, InstanceType: typ, Zone: zone, InstanceID: fmt.Sprintf("i-%d-%d", i, s)}
		length := time.Duration(rng.ExpFloat64() / rate * float64(time.Hour))
		length = min(max(length, 10*time.Minute), 48*time.Hour)
		blocked := length.Seconds() * 0.01
		end := t.Add(length)
		sess := journal.Session{ID: fmt.Sprint(s), Start: t, End: &end, Instance: m, BlockedSeconds: &blocked}
		j.Sessions = append(j.Sessions, sess)
		if s > 0 {
			j.Restores = append(j.Restores, journal.RestoreEntry{At: t, Step: step, Seconds: 30 + 60*rng.Float64()})
		}
		step += int64(length.Seconds())
		if rng.Float64() < 0.7 { // ended by an interruption
			in := journal.Interruption{Cloud: cl, Kind: "spot", InstanceType: typ, Zone: zone, Notice: end.Add(-time.Minute), Detected: end.Add(-time.Minute), Step: step}
			deadline := in.Notice.Add(2 * time.Minute)
			in.Deadline = &deadline
			if rng.Float64() < 0.85 {
				in.CommitOK = true
				committed := end
				in.Committed = &committed
			} else {
				in.LostSeconds = 600 * rng.Float64()
				in.LostSteps = int64(in.LostSeconds)
			}
			j.Interruptions = append(j.Interruptions, in)
		}
		t = end.Add(time.Duration(rng.Int64N(int64(20 * time.Minute))))
	}
	return j, step, t
}
