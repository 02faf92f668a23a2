// Package fleetsynth is the fleets spotbench's fleet sections measure:
// synthetic runs' journals, and the single fleet summary agents kept
// before issue 40, to measure it beside its replacement.
package fleetsynth

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

var (
	zones = map[string][]string{
		"aws":   {"us-east-1a", "us-east-1b", "us-west-2a"},
		"gcp":   {"us-central1-a", "europe-west4-a", "asia-east1-b"},
		"azure": {"eastus-1", "westeurope-2", "southcentralus-3"},
	}
	types = map[string][]string{
		"aws":   {"p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "g5.xlarge"},
		"gcp":   {"n1-standard-8-v100", "a2-highgpu-1g", "a3-highgpu-8g", "g2-standard-4"},
		"azure": {"Standard_NC6s_v3", "Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5"},
	}
)

// Prices is a prices.csv for the synthetic fleet's instance types.
func Prices() string {
	var b strings.Builder
	b.WriteString("instance_type,spot,on_demand\n")
	i := 0
	for _, ts := range types {
		for _, t := range ts {
			i++
			fmt.Fprintf(&b, "%s,%.2f,%.2f\n", t, 0.5*float64(i), 1.6*float64(i))
		}
	}
	return b.String()
}

// Write writes n runs' journal.json and latest.json under root.
func Write(root string, n int) error {
	rng := rand.New(rand.NewPCG(29, 10000))
	base := time.Now().Add(-60 * 24 * time.Hour).UTC().Truncate(time.Second)
	for i := range n {
		j, step, t := Journal(rng, i, base)
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

// Journal is run i of a synthetic fleet: 1–6 sessions of one
// instance type over its cloud's zones, Poisson interruptions, 85 % of
// them with the notice checkpoint committed. It returns the journal, the
// newest step and the end of its last session.
func Journal(rng *rand.Rand, i int, base time.Time) (*checkpoint.Journal, int64, time.Time) {
	clouds := []string{"aws", "gcp", "azure"}
	id := fmt.Sprintf("run-%06d", i)
	cl := clouds[rng.IntN(3)]
	typ := types[cl][rng.IntN(4)]
	rate := 0.01 * float64(1+rng.IntN(5)) // per hour
	j := &checkpoint.Journal{Format: checkpoint.JournalFormat, RunID: id}
	t := base.Add(time.Duration(rng.Int64N(int64(55 * 24 * time.Hour))))
	var step int64
	for s := range 1 + rng.IntN(6) {
		zone := zones[cl][rng.IntN(3)]
		m := checkpoint.Machine{Cloud: cl, InstanceType: typ, Zone: zone, InstanceID: fmt.Sprintf("i-%d-%d", i, s)}
		length := time.Duration(rng.ExpFloat64() / rate * float64(time.Hour))
		length = min(max(length, 10*time.Minute), 48*time.Hour)
		blocked := length.Seconds() * 0.01
		end := t.Add(length)
		sess := checkpoint.Session{ID: fmt.Sprint(s), Start: t, End: &end, Instance: m, BlockedSeconds: &blocked}
		j.Sessions = append(j.Sessions, sess)
		if s > 0 {
			j.Restores = append(j.Restores, checkpoint.RestoreEntry{At: t, Step: step, Seconds: 30 + 60*rng.Float64()})
		}
		step += int64(length.Seconds())
		if rng.Float64() < 0.7 { // ended by an interruption
			in := checkpoint.Interruption{Cloud: cl, Kind: "spot", InstanceType: typ, Zone: zone, Notice: end.Add(-time.Minute), Detected: end.Add(-time.Minute), Step: step}
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
