package main

import (
	"bytes"
	"context"
	"encoding/json"
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
)

// counted counts a store's requests (List as one) and the bytes written
// and read through it.
type counted struct {
	cloud.Store
	requests, written, read atomic.Int64
}

func (c *counted) reset() { c.requests.Store(0); c.written.Store(0); c.read.Store(0) }

func (c *counted) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	c.requests.Add(1)
	c.written.Add(size)
	return c.Store.Put(ctx, key, r, size, opts)
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

func (c *counted) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.requests.Add(1)
	rc, err := c.Store.Get(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return countingReader{rc, &c.read}, nil
}

func (c *counted) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	c.requests.Add(1)
	return c.Store.Stat(ctx, key)
}

func (c *counted) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	c.requests.Add(1)
	return c.Store.List(ctx, prefix, fn)
}

func (c *counted) Delete(ctx context.Context, key string) error {
	c.requests.Add(1)
	return c.Store.Delete(ctx, key)
}

// burst is what one burst of agents ending at once cost.
type burst struct {
	requests, bytes int64
	took            time.Duration // until every session is recorded (or the deadline)
	lost            int
}

// benchFleetScale measures the fleet records against MinIO (issue 40),
// beside the single summary they replace (fleetold.go), in the same run:
// c.fleetAgents agents ending at once, an agent's start-up read and
// `spotagent fleet` at each of c.fleetRuns.
func benchFleetScale(c *config, r *report) error {
	if _, err := os.Stat(c.minio); err != nil {
		r.add("9b. Fleet records at fleet scale (MinIO)", fmt.Sprintf("Not measured: no MinIO binary at %s (%v); scripts/bench.sh installs it with `go install github.com/minio/minio@latest`.\n", c.minio, err))
		return nil
	}
	env := &stores{}
	defer env.Close()
	m, err := env.startMinIO(c, "minio-fleet")
	if err != nil {
		return err
	}
	env.minio = m
	for _, kv := range m.env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	ctx := context.Background()
	open := func(prefix string) (*counted, error) {
		st, err := all.Open(ctx, "s3://"+bucket+"/"+prefix, all.Options{})
		if err != nil {
			return nil, err
		}
		return &counted{Store: st}, nil
	}
	reps := max(c.fleetReps, 3)
	var b strings.Builder
	fmt.Fprintf(&b, "MinIO (single drive, data on tmpfs when there is room), the agents' recording code driven by goroutines of this process through the real S3 store (`all.Open`, retries included). Requests count store operations (a List as one, however many pages); bytes are object bytes written and read. Old: the single `fleet-summary.json` every agent read whole and rewrote with a compare-and-swap (pkg/fleet before issue 40, copied in bench/cmd/spotbench/fleetold.go); new: one record per session, merged and compacted by `spotagent fleet`. Medians of %d.\n\n", reps)

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
		if s, _, err := oldReadSummary(ctx, ost.Store); err == nil {
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
		return median(xs)
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
		size, err := putOldSummary(ctx, st.Store, n)
		if err != nil {
			return err
		}
		uri := "s3://" + bucket + fmt.Sprintf("/size-%d", n)
		cli := func(args ...string) (time.Duration, error) {
			cmd := exec.Command(c.bin, append([]string{"fleet", "--store", uri}, args...)...)
			cmd.Env = append(os.Environ(), m.env()...)
			var errb strings.Builder
			cmd.Stderr = &errb
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return 0, fmt.Errorf("spotagent fleet: %w: %s", err, errb.String())
			}
			return time.Since(start), nil
		}
		migrate, err := cli() // reads the v1 summary, recounts (no journals), saves
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
			st.reset()
			t0 := time.Now()
			p, err := fleet.PriorFrom(ctx, st, k, 0.05, fleet.DefaultMinHours)
			if err != nil {
				return err
			}
			newRead = append(newRead, ms(time.Since(t0)))
			newReq, newKB = append(newReq, float64(st.requests.Load())), append(newKB, float64(st.read.Load()+st.written.Load())/1e3)
			st.reset()
			t0 = time.Now()
			op, err := oldPrior(ctx, st, k)
			if err != nil {
				return err
			}
			oldRead = append(oldRead, ms(time.Since(t0)))
			oldReq, oldKB = append(oldReq, float64(st.requests.Load())), append(oldKB, float64(st.read.Load()+st.written.Load())/1e3)
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
			d, err := cli()
			if err != nil {
				return err
			}
			cliT = append(cliT, d.Seconds())
			t0 = time.Now()
			if err := oldReport(ctx, st.Store); err != nil {
				return err
			}
			oldT = append(oldT, time.Since(t0).Seconds())
		}
		fmt.Fprintf(&b, "| %d | %.1f | %.0f, %.0f, %.1f | %.0f, %.0f, %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n, float64(size)/1e6,
			median(newRead), median(newReq), median(newKB), median(oldRead), median(oldReq), median(oldKB),
			median(cliT), median(inT), median(idleT), median(oldT), migrate.Seconds())
		if n == 100000 {
			hundredK = time.Duration(median(cliT) * float64(time.Second))
		}
		st.Close()
	}
	b.WriteString("\nThe new start-up read is a Stat and a Get of the instance type's sums (`fleet/prior/CLOUD/TYPE.json`), one List of the record names under its instance type (at most 2,000; the List response, about 100 bytes a name, is not in the kB column) and a Stat: the same whatever the fleet's size. The old read is the whole summary. `fleet` new (CLI) is the whole command, process start included, each time folding a fresh burst's records into the summary (read, compaction: summary rewrite, prior sums, deletes); \"nothing pending\" is the read alone, the old code's equivalent. The new summary grows by each burst's runs (up to 2 × reps × agents more than N).\n")
	r.add("9b. Fleet records at fleet scale (MinIO, issue 40)", b.String())
	if hundredK > 0 {
		r.target(target{name: "`spotagent fleet` on 100,000 runs (MinIO, records pending)", want: "< 10 s",
			got: hundredK.Round(time.Millisecond).String(), met: hundredK < 10*time.Second, margin: fmt.Sprintf("%+.2f s", 10-hundredK.Seconds())})
	}
	lost := medB(newB, func(x burst) float64 { return float64(x.lost) })
	r.target(target{name: fmt.Sprintf("sessions lost when %d agents end at once", c.fleetAgents), want: "0",
		got: fmt.Sprintf("%.0f", lost), met: lost == 0, margin: "-"})
	r.command("SPOTBENCH_ONLY=fleet make bench (section 9b: SPOTBENCH_FLEET_AGENTS, SPOTBENCH_FLEET_RUNS)")
	return nil
}

// agentsEnd starts n goroutines, each an agent of its own run ending one
// session, releases them at once and waits until every one has recorded
// it (old: the summary's compare-and-swap, cut at deadline).
func agentsEnd(st *counted, n, rep int, deadline time.Duration, old bool) (burst, error) {
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
		j, step, _ := syntheticJournal(rng, i, base)
		j.RunID = fmt.Sprintf("burst-%d-%05d", rep, i)
		agents[i] = agent{j.RunID, j, step}
	}
	st.reset()
	var wg sync.WaitGroup
	var lost atomic.Int64
	gate := make(chan struct{})
	for _, a := range agents {
		wg.Go(func() {
			<-gate
			var err error
			if old {
				err = oldRecordSession(ctx, st, a.dir, a.j, a.step)
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
	return burst{requests: st.requests.Load(), bytes: st.written.Load() + st.read.Load(), took: time.Since(start), lost: int(lost.Load())}, nil
}

// putOldSummary writes a v1 summary of n synthetic runs, as agents before
// issue 40 left it at the fleet root, and returns its size.
func putOldSummary(ctx context.Context, st cloud.Store, n int) (int, error) {
	rng := rand.New(rand.NewPCG(29, uint64(n)))
	base := time.Now().Add(-60 * 24 * time.Hour).UTC().Truncate(time.Second)
	s := oldSummary{Format: "spotagent.fleet/v1", Updated: time.Now().UTC(), Baseline: time.Now().UTC(), Runs: map[string]*fleet.Run{}}
	for i := range n {
		j, step, _ := syntheticJournal(rng, i, base)
		r, err := fleet.RunOf(j, j.RunID, step, time.Now())
		if err != nil {
			return 0, err
		}
		s.Runs[r.Dir] = r
	}
	body, err := json.Marshal(s)
	if err != nil {
		return 0, err
	}
	return len(body), st.Put(ctx, oldSummaryKey, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{})
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

// oldReport is what `spotagent fleet` did before issue 40, in process.
func oldReport(ctx context.Context, st cloud.Store) error {
	s, _, err := oldReadSummary(ctx, st)
	if err != nil {
		return err
	}
	rep, err := fleet.Build(&fleet.Summary{Runs: s.Runs}, fleet.Options{Now: time.Now()}, "summary", nil)
	if err != nil {
		return err
	}
	return fleet.Write(io.Discard, rep, "table")
}
