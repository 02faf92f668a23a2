package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spotagent/spotagent/bench/internal/peerjob"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/bench/internal/stream"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
)

// The peer section (issue 38 item 2): a job of 2 nodes × 2 ranks (and
// one of 4 × 1) commits one checkpoint (each rank: a replica file, the
// same bytes on every rank as data-parallel weights are, and a shard of
// its own); every machine is lost; the survivors come back on their
// machines (local tier), node 1 on an empty one. Measured: node 1's
// `spotagent sidecar` started → "restored checkpoint", each node's agent
// started → every rank welcomed with the resume (its files readable), and
// the bytes node 1 read from the store, without the peer tier (today: the
// store) and with it (--peer-restore, and --replicas 1).

func benchPeer(c *config, r *report.Report) error {
	// The 2 × 2 job's part of node 1 is used once more for the single
	// transfer figure; the 4 × 1 job runs beside it.
	var lines []string
	var targets []report.Target
	var replica int64
	for i, sh := range []peerjob.Shape{{Nodes: 2, Ranks: 2}, {Nodes: 4, Ranks: 1}} {
		res, rep, err := benchPeerShape(c, sh, i == 0)
		if err != nil {
			return fmt.Errorf("%s job: %w", sh, err)
		}
		if i == 0 {
			replica = rep
		}
		for _, m := range peerjob.Modes {
			runs := res.runs[m.Name]
			var t, e, s, sb, pb, vb []float64
			for _, x := range runs {
				t, e, s = append(t, x.Took), append(e, x.Resumed), append(s, x.Survivors)
				sb, pb = append(sb, float64(x.StoreBytes)), append(pb, float64(x.PeerBytes))
				vb = append(vb, float64(x.SurvivorStore))
			}
			job := make([]float64, len(runs))
			for j, x := range runs {
				job[j] = max(x.Resumed, x.Survivors)
			}
			lines = append(lines, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %.1f MiB | %.1f MiB | %.1f MiB |", sh, m.Name, medRange(t), medRange(e), medRange(s), medRange(job), stats.Median(sb)/(1<<20), stats.Median(pb)/(1<<20), stats.Median(vb)/(1<<20)))
		}
		part := float64(sh.Ranks) * float64(res.perRank)
		ps, rs, ss := res.median("peer", storeB), res.median("peer, --replicas 1", storeB), res.median("store", storeB)
		targets = append(targets,
			report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %s job, %d MiB part, replicas on other nodes", sh, c.peerMiB),
				Want: "≤ one part without replication", Got: fmt.Sprintf("%.1f MiB (store only: %.1f MiB)", ps/(1<<20), ss/(1<<20)),
				Met: ps <= part, Margin: fmt.Sprintf("%.1f MiB", (part-ps)/(1<<20))},
			report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %s job, %d MiB part, --replicas 1", sh, c.peerMiB),
				Want: "0 with replication", Got: fmt.Sprintf("%.1f MiB", rs/(1<<20)), Met: rs == 0, Margin: fmt.Sprintf("%.1f MiB over", rs/(1<<20))})
		if i == 0 {
			targets = append(targets, res.stream)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "A job of N nodes × R ranks (2 × 2 and 4 × 1; one `spotagent sidecar --node-rank K` agent a node, each its own checkpoint directory and socket; the ranks played over the real protocol by spotbench) commits one checkpoint of %d MiB per node to an in-process S3 (gofakes3 on loopback): each rank saves a replica file (3/4 of its bytes; the same bytes on every rank, as data-parallel weights are) and a shard of its own (1/4). Every machine is lost (SIGKILL). Each run: the surviving machines' agents start again on their directories (they restore from their local tier, then serve it), their ranks say hello; once they serve, node 1 comes back on an empty machine (a fresh directory each run: a replacement machine comes up after the survivors) and its ranks say hello. *restored*: node 1's agent started → its \"restored checkpoint\" line; *resumed*: an agent started → every rank of its node welcomed (version 1 hello: the welcome waits for the restore) naming step %d, with its two files in the welcome's directory at their sizes: the moment a rank could take its first resumed step; *every node*: the larger of node 1's and the slowest survivor's (each from its own agent's start). Bytes: the agents' own counts (the journal's; the survivors' summed). *store*: no agent runs the peer tier (node 1 reads everything from the store); *peer*: every agent runs with `--peer-restore` (the survivors offer their own parts: node 1's replica files); *peer, --replicas 1*: the survivors also offer the copies of other nodes' parts they kept after the commit (the seeding job ran with `--replicas 1`), so node 1's shards come from them too. %d runs per mode (store and peer alternating), medians (min–max), seconds. Everything shares this machine's cores and loopback: the times say little about real hosts, the bytes are what the peer tier saves.\n\n",
		c.peerMiB, peerjob.Step, max(3, c.e2eReps))
	b.WriteString("| job | mode | node 1: start → restored | node 1: start → resumed | survivors: start → resumed | every node resumed | node 1: bytes from the store | node 1: bytes from peers | survivors: bytes from the store |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	b.WriteString(strings.Join(lines, "\n") + "\n")
	st := targets[2]
	fmt.Fprintf(&b, "\nOne peer transfer (pkg/checkpoint/peertier's client asking node 0's agent of the 2 × 2 job for one %d MiB replica file, signed, into a reader that discards it): %s; one plain TCP stream on the same loopback, the same bytes from memory, median of 3. Both share the cores with the agents and whatever else runs (see the load average): compare them within one run only.\n",
		replica>>20, st.Got)
	r.Add(fmt.Sprintf("Restore from a peer: node 1 replaced, %d MiB per node", c.peerMiB), b.String())
	r.Command("spotagent sidecar --store URI --run-id bench-peer --node-rank K --checkpoint-dir DIR --cloud none --interval 1h --log-format json [--peer-restore --peer-listen 127.0.0.1:0 --peer-advertise 127.0.0.1 [--replicas 1]]")
	for _, t := range targets {
		r.Target(t)
	}
	return nil
}

func medRange(xs []float64) string {
	lo, hi := stats.MinMax(xs)
	return fmt.Sprintf("%.2f (%.2f–%.2f)", stats.Median(xs), lo, hi)
}

type peerShapeResult struct {
	runs    map[string][]peerjob.Run1
	perRank int64
	stream  report.Target // 2 × 2 only
}

func storeB(x peerjob.Run1) float64 { return float64(x.StoreBytes) }

func (p peerShapeResult) median(mode string, f func(peerjob.Run1) float64) float64 {
	var xs []float64
	for _, x := range p.runs[mode] {
		xs = append(xs, f(x))
	}
	return stats.Median(xs)
}

// benchPeerShape seeds sh's job and runs every mode; withStream: the
// single-transfer figure too. It returns the runs and the replica size.
func benchPeerShape(c *config, sh peerjob.Shape, withStream bool) (peerShapeResult, int64, error) {
	work := filepath.Join(c.work, fmt.Sprintf("peer-%dx%d", sh.Nodes, sh.Ranks))
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return peerShapeResult{}, 0, err
	}
	defer os.RemoveAll(work)
	srv, err := s3test.Start("bench-peer")
	if err != nil {
		return peerShapeResult{}, 0, err
	}
	defer srv.Close()
	j := &peerjob.Job{Bin: c.bin, Shape: sh, Env: append(os.Environ(), srv.Env()...), URI: "s3://" + srv.Bucket + "/" + peerjob.RunID, Work: work}
	defer j.StopSurvivors()
	perRank := int64(c.peerMiB) << 20 / int64(sh.Ranks)
	replica, shard := perRank*3/4, perRank/4
	logf("seeding: a job of %s ranks commits %d MiB per node (replica %d MiB + shard %d MiB per rank) to an in-process S3", sh, c.peerMiB, replica>>20, shard>>20)
	if err := j.Seed(replica, shard); err != nil {
		return peerShapeResult{}, 0, fmt.Errorf("seed: %w", err)
	}
	res := peerShapeResult{runs: map[string][]peerjob.Run1{}, perRank: replica + shard}
	n := 0
	one := func(m peerjob.Mode) error {
		n++
		x, err := j.Run(m, n)
		if err != nil {
			return fmt.Errorf("%s run %d: %w", m.Name, n, err)
		}
		res.runs[m.Name] = append(res.runs[m.Name], x)
		logf("%s %-18s node 1: start → restored %.2fs, → resumed %.2fs; survivors → resumed %.2fs; %d MiB from the store, %d MiB from peers", sh, m.Name, x.Took, x.Resumed, x.Survivors, x.StoreBytes>>20, x.PeerBytes>>20)
		return nil
	}
	for rep := range max(3, c.e2eReps) {
		order := []peerjob.Mode{peerjob.Modes[0], peerjob.Modes[1]}
		if rep%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, m := range order {
			if err := one(m); err != nil {
				return res, 0, err
			}
		}
	}
	for range max(3, c.e2eReps) {
		if err := one(peerjob.Modes[2]); err != nil {
			return res, 0, err
		}
	}
	if withStream { // node 0 of the last run serves still
		rates, err := peerjob.Stream(srv, j.URI)
		if err != nil {
			return res, 0, err
		}
		var tcps []float64
		for range 3 {
			t, err := stream.Loopback(replica)
			if err != nil {
				return res, 0, err
			}
			tcps = append(tcps, t)
		}
		tcp := stats.Median(tcps)
		lo, hi := stats.MinMax(rates)
		res.stream = report.Target{Name: fmt.Sprintf("one peer transfer (%d MiB file) against one TCP stream, loopback", replica>>20),
			Want: "≥ 0.9 × the TCP stream", Got: fmt.Sprintf("%.0f MiB/s (%.0f–%.0f, %d runs; TCP %.0f MiB/s)", stats.Median(rates), lo, hi, len(rates), tcp),
			Met: stats.Median(rates) >= 0.9*tcp, Margin: fmt.Sprintf("%.2f×", stats.Median(rates)/tcp)}
	}
	return res, replica, nil
}
