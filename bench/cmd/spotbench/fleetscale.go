package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/fleet"

	"github.com/spotagent/spotagent/bench/internal/benchstore"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"

	"github.com/spotagent/spotagent/bench/internal/fleetsynth"
)

// burst is what one burst of agents ending at once cost.
type burst struct {
	requests, bytes int64
	took            time.Duration // until every session is recorded (or the deadline)
	lost            int
}

// benchFleetScale measures the fleet records against MinIO (issue 40),
// beside the single summary they replace (fleetsynth/old.go), in the same run:
// c.fleetAgents agents ending at once, an agent's start-up read and
// `spotagent fleet` at each of c.fleetRuns.
func benchFleetScale(c *config, r *report.Report) error {
	if _, err := os.Stat(c.minio); err != nil {
		r.Add("9b. Fleet records at fleet scale (MinIO)", fmt.Sprintf("Not measured: no MinIO binary at %s (%v); scripts/bench.sh installs it with `go install github.com/minio/minio@latest`.\n", c.minio, err))
		return nil
	}
	env := benchstore.New(c.minio, c.work)
	defer env.Close()
	m, err := env.StartMinIO("minio-fleet")
	if err != nil {
		return err
	}
	for _, kv := range m.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	ctx := context.Background()
	open := func(prefix string) (*benchstore.Counted, error) {
		st, err := all.Open(ctx, "s3://"+benchstore.Bucket+"/"+prefix, all.Options{})
		if err != nil {
			return nil, err
		}
		return &benchstore.Counted{Store: st}, nil
	}
	reps := max(c.fleetReps, 3)
	var b strings.Builder
	fmt.Fprintf(&b, "MinIO (single drive, data on tmpfs when there is room), the agents' recording code driven by goroutines of this process through the real S3 store (`all.Open`, retries included). Requests count store operations (a List as one, however many pages); bytes are object bytes written and read. Old: the single `fleet-summary.json` every agent read whole and rewrote with a compare-and-swap (pkg/fleet before issue 40, copied in bench/internal/fleetsynth/old.go); new: one record per session, merged and compacted by `spotagent fleet`. Medians of %d.\n\n", reps)

	// 1. Agents ending at once.
	var newB, oldB []burst
	for rep := range reps {
		st, err := open(fmt.Sprintf("burst-new-%d", rep))
		if err != nil {
			return err
		}
		bu, err := agentsEnd(st, c.fleetAgents, rep, c.fleetOldDeadline, false)
		if err != nil {
			return err
		}
		// Every session must be there: one record per agent.
		n := 0
		st.Store.List(ctx, "fleet/sessions/", func(cloud.ObjectInfo) error { n++; return nil })
		bu.lost = max(bu.lost, c.fleetAgents-n)
		newB = append(newB, bu)
		logf("fleet: %d agents, new: %d requests, %.1f MB, %s, %d lost", c.fleetAgents, bu.requests, float64(bu.bytes)/1e6, bu.took.Round(time.Millisecond), bu.lost)
		st.Close()

		ost, err := open(fmt.Sprintf("burst-old-%d", rep))
		if err != nil {
			return err
		}
		bu, err = agentsEnd(ost, c.fleetAgents, rep, c.fleetOldDeadline, true)
		if err != nil {
			return err
		}
		if s, _, err := fleetsynth.ReadOldSummary(ctx, ost.Store); err == nil {
			bu.lost = max(bu.lost, c.fleetAgents-len(s.Runs))
		} else {
			bu.lost = c.fleetAgents
		}
		oldB = append(oldB, bu)
		logf("fleet: %d agents, old: %d requests, %.1f MB, %s, %d lost", c.fleetAgents, bu.requests, float64(bu.bytes)/1e6, bu.took.Round(time.Millisecond), bu.lost)
		ost.Close()
	}
	medB := func(bs []burst, f func(burst) float64) float64 {
		var xs []float64
		for _, x := range bs {
			xs = append(xs, f(x))
		}
		return stats.Median(xs)
	}
	fmt.Fprintf(&b, "**%d agents ending at once** (each its own run, one session; the old code from an empty summary, its best case, cut at %s):\n\n", c.fleetAgents, c.fleetOldDeadline)
	b.WriteString("| | new (records) | old (one summary) |\n|---|---|---|\n")
	row := func(name string, f func(burst) float64, format string) {
		fmt.Fprintf(&b, "| %s | "+format+" | "+format+" |\n", name, medB(newB, f), medB(oldB, f))
	}
	row("store requests", func(x burst) float64 { return float64(x.requests) }, "%.0f")
	row("bytes moved (MB)", func(x burst) float64 { return float64(x.bytes) / 1e6 }, "%.2f")
	row("time until every session is recorded (s)", func(x burst) float64 { return x.took.Seconds() }, "%.2f")
	row("sessions lost", func(x burst) float64 { return float64(x.lost) }, "%.0f")
	b.WriteString("\n")

	// 2. Start-up read and `spotagent fleet` at each fleet size.
	b.WriteString("**An agent's start-up read (its prior) and `spotagent fleet`** over a fleet of N synthetic runs (1–6 sessions each on 3 clouds × 4 instance types × 3 zones), with the burst's records pending (not yet compacted):\n\n")
	b.WriteString("| runs | old summary MB | start-up read new: ms, requests, kB | old: ms, requests, kB | `fleet` new (CLI, table), s | `fleet` new, in process, s | new, nothing pending, in process, s | old (read + build + table), in process, s | first `fleet` (migrates the old summary), s |\n|---|---|---|---|---|---|---|---|---|\n")
	var hundredK time.Duration
	for _, n := range c.fleetRuns {
		st, err := open(fmt.Sprintf("size-%d", n))
		if err != nil {
			return err
		}
		size, err := fleetsynth.PutOldSummary(ctx, st.Store, n)
		if err != nil {
			return err
		}
		uri := "s3://" + benchstore.Bucket + fmt.Sprintf("/size-%d", n)
		cli := func(args ...string) (time.Duration, error) {
			cmd := exec.Command(c.bin, append([]string{"fleet", "--store", uri}, args...)...)
			cmd.Env = append(os.Environ(), m.Env()...)
			var errb strings.Builder
			cmd.Stderr = &errb
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return 0, fmt.Errorf("spotagent fleet: %w: %s", err, errb.String())
			}
			return time.Since(start), nil
		}
		migrate, err := cli("--save-summary") // reads the v1 summary, recounts (no journals), saves
		if err != nil {
			return err
		}
		k := fleet.Key{Cloud: "aws", InstanceType: "p4d.24xlarge", Zone: "us-east-1a"}
		var newRead, oldRead []float64
		var newReq, oldReq, newKB, oldKB []float64
		var cliT, inT, idleT, oldT []float64
		for rep := range reps {
			// The burst's records, pending.
			if _, err := agentsEnd(st, c.fleetAgents, 100+rep, c.fleetOldDeadline, false); err != nil {
				return err
			}
			st.Reset()
			t0 := time.Now()
			p, err := fleet.PriorFrom(ctx, st, k, 0.05, fleet.DefaultMinHours)
			if err != nil {
				return err
			}
			newRead = append(newRead, stats.MS(time.Since(t0)))
			newReq, newKB = append(newReq, float64(st.Requests.Load())), append(newKB, float64(st.Read.Load()+st.Written.Load())/1e3)
			st.Reset()
			t0 = time.Now()
			op, err := fleetsynth.OldPrior(ctx, st, k)
			if err != nil {
				return err
			}
			oldRead = append(oldRead, stats.MS(time.Since(t0)))
			oldReq, oldKB = append(oldReq, float64(st.Requests.Load())), append(oldKB, float64(st.Read.Load()+st.Written.Load())/1e3)
			if rep == 0 {
				logf("fleet: %d runs: prior new %s, old %s", n, p, op)
			}
			// In process: new Load + Build + table (it compacts the burst);
			// then a fresh burst for the CLI.
			t0 = time.Now()
			if err := newFleetReport(ctx, st.Store); err != nil {
				return err
			}
			inT = append(inT, time.Since(t0).Seconds())
			t0 = time.Now()
			if err := newFleetReport(ctx, st.Store); err != nil { // nothing pending now
				return err
			}
			idleT = append(idleT, time.Since(t0).Seconds())
			if _, err := agentsEnd(st, c.fleetAgents, 200+rep, c.fleetOldDeadline, false); err != nil {
				return err
			}
			d, err := cli("--save-summary") // folds the burst in
			if err != nil {
				return err
			}
			cliT = append(cliT, d.Seconds())
			t0 = time.Now()
			if err := fleetsynth.OldReport(ctx, st.Store); err != nil {
				return err
			}
			oldT = append(oldT, time.Since(t0).Seconds())
		}
		fmt.Fprintf(&b, "| %d | %.1f | %.0f, %.0f, %.1f | %.0f, %.0f, %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n, float64(size)/1e6,
			stats.Median(newRead), stats.Median(newReq), stats.Median(newKB), stats.Median(oldRead), stats.Median(oldReq), stats.Median(oldKB),
			stats.Median(cliT), stats.Median(inT), stats.Median(idleT), stats.Median(oldT), migrate.Seconds())
		if n == 100000 {
			hundredK = time.Duration(stats.Median(cliT) * float64(time.Second))
		}
		st.Close()
	}
	b.WriteString("\nThe new start-up read is a Stat and a Get of the instance type's sums (`fleet/prior/CLOUD/TYPE.json`), one List of the record names under its instance type (at most 2,000; the List response, about 100 bytes a name, is not in the kB column) and a Stat: the same whatever the fleet's size. The old read is the whole summary. `fleet` new (CLI) is the whole command, process start included, each time folding a fresh burst's records into the summary (read, compaction: summary rewrite, prior sums, deletes); \"nothing pending\" is the read alone, the old code's equivalent. The new summary grows by each burst's runs (up to 2 × reps × agents more than N).\n")
	r.Add("9b. Fleet records at fleet scale (MinIO, issue 40)", b.String())
	if hundredK > 0 {
		r.Target(report.Target{Name: "`spotagent fleet` on 100,000 runs (MinIO, records pending)", Want: "< 10 s",
			Got: hundredK.Round(time.Millisecond).String(), Met: hundredK < 10*time.Second, Margin: fmt.Sprintf("%+.2f s", 10-hundredK.Seconds())})
	}
	lost := medB(newB, func(x burst) float64 { return float64(x.lost) })
	r.Target(report.Target{Name: fmt.Sprintf("sessions lost when %d agents end at once", c.fleetAgents), Want: "0",
		Got: fmt.Sprintf("%.0f", lost), Met: lost == 0, Margin: "-"})
	r.Command("SPOTBENCH_ONLY=fleet make bench (section 9b: SPOTBENCH_FLEET_AGENTS, SPOTBENCH_FLEET_RUNS)")
	return nil
}

// agentsEnd starts n goroutines, each an agent of its own run ending one
// session, releases them at once and waits until every one has recorded
// it (old: the summary's compare-and-swap, cut at deadline).
func agentsEnd(st *benchstore.Counted, n, rep int, deadline time.Duration, old bool) (burst, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	rng := rand.New(rand.NewPCG(uint64(rep), 40))
	base := time.Now().Add(-24 * time.Hour).UTC()
	type agent struct {
		dir  string
		j    *journal.Journal
		step int64
	}
	agents := make([]agent, n)
	for i := range agents {
		j, step, _ := fleetsynth.Journal(rng, i, base)
		j.RunID = fmt.Sprintf("burst-%d-%05d", rep, i)
		agents[i] = agent{j.RunID, j, step}
	}
	st.Reset()
	var wg sync.WaitGroup
	var lost atomic.Int64
	gate := make(chan struct{})
	for _, a := range agents {
		wg.Go(func() {
			<-gate
			var err error
			if old {
				err = fleetsynth.RecordOldSession(ctx, st, a.dir, a.j, a.step)
			} else {
				err = fleet.RecordSession(ctx, st, a.dir, a.j, a.step)
			}
			if err != nil {
				lost.Add(1)
			}
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	return burst{requests: st.Requests.Load(), bytes: st.Written.Load() + st.Read.Load(), took: time.Since(start), lost: int(lost.Load())}, nil
}

// newFleetReport is what `spotagent fleet` does, in process.
func newFleetReport(ctx context.Context, st cloud.Store) error {
	l, err := fleet.Load(ctx, st, false, false, time.Now())
	if err != nil {
		return err
	}
	rep, err := fleet.Build(l.Summary, fleet.Options{Now: time.Now()}, l.Source, l.Damaged)
	if err != nil {
		return err
	}
	if err := fleet.Write(io.Discard, rep, "table"); err != nil {
		return err
	}
	return l.Compact(ctx)
}
