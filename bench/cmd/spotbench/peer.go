package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spotagent/spotagent/bench/internal/peerjob"
	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/bench/internal/stream"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
)

// The peer section (issue 38 item 2): a job of 2 nodes × 2 ranks under
// the real torchrun (and one of 4 × 1, its ranks played over the protocol)
// commits one checkpoint (each rank: a replica file, the same bytes on
// every rank as data-parallel weights are, and a shard of its own); every
// machine is lost; the survivors come back on their machines (local tier),
// node 1 on an empty one. Measured: each node's agent started → restored,
// → every rank's first resumed step (torchrun; the stand-ins: welcomed with
// the resume), and the bytes node 1 read from the store, without the peer
// tier (today: the store) and with it (--peer-restore, and --replicas 1).

func benchPeer(c *config, r *report.Report) error {
	py, err := torchrunJob()
	if err != nil {
		return err
	}
	var targets []report.Target
	var replica int64
	var b strings.Builder
	for i, sh := range []peerjob.Shape{{Nodes: 2, Ranks: 2}, {Nodes: 4, Ranks: 1}} {
		tr := py
		if i > 0 {
			tr = nil // the stand-in ranks: the larger shape, cheaply
		}
		res, rep, err := benchPeerShape(c, sh, tr, i == 0)
		if err != nil {
			return fmt.Errorf("%s job: %w", sh, err)
		}
		if i == 0 {
			replica = rep
			fmt.Fprintf(&b, "**%s job under the real torchrun.** One `spotagent run --node-rank K` a node (each its own checkpoint directory and socket) around `python3 python/examples/torchrun.py --nnodes 2 --node_rank K --nproc_per_node 2 ... bench/peer_trainer.py` (Debian's torch 1.13, gloo on the CPU, a rendezvous port of its own each run) commits one checkpoint of %d MiB per node to an in-process S3 (gofakes3 on loopback): each rank torch.saves `replica-R.pt` (3/4 of its bytes: a tensor with the same bytes on every rank, as data-parallel weights are, so the files are equal) and `shard-R.pt` (1/4: its own tensor, beside a small DDP model's state) at the step the agent asked for (step %d). Every machine is lost (SIGKILL of every agent; each agent's guard kills its torchrun and ranks). Each run: the surviving node's agent starts again on its directory (it restores from its local tier and, peer modes, serves it); once it has, node 1's agent starts on an empty machine (a fresh directory each run). Each torchrun waits in its rendezvous for the other; then every rank imports torch, joins the process group, connects to its agent, reads `agent.resume_dir` (it blocks while the agent restores: the restore runs beside torchrun's and the ranks' start), torch.loads both its files, checks them and takes one DDP step, whose all_reduce waits for every rank of the job. Times from each node's own agent start, the slowest rank of the node: *restored*: the agent's \"restored checkpoint\" line; *rank started*: the rank's python3 started (after torchrun's own python3 start, its import of torch and its rendezvous with the other node's torchrun); *torch imported*: the rank's `import torch` done (these two are the same work in every mode); *resume_dir*: it returned; *loaded*: both files torch.loaded; *first step*: the first resumed step taken (the job's first all_reduce: on the survivor it includes waiting for node 1's agent start and restore). Bytes: the agents' own counts. *store*: no agent runs the peer tier (node 1 reads everything from the store); *peer*: `--peer-restore` (the survivor offers its own part: node 1's replica files); *peer, --replicas 1*: the survivor also offers the copy of node 1's part it kept after the commit (the seeding job ran with `--replicas 1`), so node 1's shards come from it too. %d runs per mode (store and peer alternating), medians (min–max), seconds.\n\n",
				sh, c.peerMiB, res.step, max(3, c.e2eReps))
			b.WriteString("| mode | node 1: start → restored | → rank started | → torch imported | → resume_dir | → loaded | → first resumed step | survivor: start → restored | survivor: start → first resumed step | node 1: bytes from the store | node 1: bytes from peers | survivor: bytes from the store |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		} else {
			fmt.Fprintf(&b, "\n**%s job, the ranks played over the real protocol by spotbench** (bench/internal/jobrank; one `spotagent sidecar --node-rank K` a node): the same checkpoint layout (`replica-R.bin`, `shard-R.bin`), %d MiB per node, the same order (the survivors first, then node 1 on an empty machine). *resumed*: an agent started → every rank of its node welcomed (a version 1 hello waits for the restore) naming the step, with its two files in the welcome's directory at their sizes; no torch, no first step.\n\n", sh, c.peerMiB)
			b.WriteString("| mode | node 1: start → restored | node 1: start → resumed | survivors: start → resumed | node 1: bytes from the store | node 1: bytes from peers | survivors: bytes from the store |\n| --- | --- | --- | --- | --- | --- | --- |\n")
		}
		for _, m := range peerjob.Modes {
			col := func(f func(peerjob.Run1) float64) string { return medRange(res.col(m.Name, f)) }
			mib := func(f func(peerjob.Run1) float64) string {
				return fmt.Sprintf("%.1f MiB", stats.Median(res.col(m.Name, f))/(1<<20))
			}
			bytes := mib(storeB) + " | " + mib(func(x peerjob.Run1) float64 { return float64(x.PeerBytes) }) + " | " + mib(func(x peerjob.Run1) float64 { return float64(x.SurvivorStore) })
			if tr != nil {
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.Name,
					col(func(x peerjob.Run1) float64 { return x.Took }), col(func(x peerjob.Run1) float64 { return x.Started }),
					col(func(x peerjob.Run1) float64 { return x.Imported }),
					col(func(x peerjob.Run1) float64 { return x.RankRestored }), col(func(x peerjob.Run1) float64 { return x.Loaded }),
					col(func(x peerjob.Run1) float64 { return x.Resumed }), col(func(x peerjob.Run1) float64 { return x.SurvRestored }),
					col(func(x peerjob.Run1) float64 { return x.Survivors }), bytes)
			} else {
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", m.Name, col(func(x peerjob.Run1) float64 { return x.Took }),
					col(func(x peerjob.Run1) float64 { return x.Resumed }), col(func(x peerjob.Run1) float64 { return x.Survivors }), bytes)
			}
		}
		part := float64(sh.Ranks) * float64(res.perRank)
		ps, rs, ss := res.median("peer", storeB), res.median("peer, --replicas 1", storeB), res.median("store", storeB)
		kind := ", torchrun"
		if tr == nil {
			kind = ", protocol ranks"
		}
		targets = append(targets,
			report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %s job%s, %d MiB part, replicas on other nodes", sh, kind, c.peerMiB),
				Want: "≤ one part without replication", Got: fmt.Sprintf("%.1f MiB (store only: %.1f MiB)", ps/(1<<20), ss/(1<<20)),
				Met: ps <= part, Margin: fmt.Sprintf("%.1f MiB", (part-ps)/(1<<20))},
			report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %s job%s, %d MiB part, --replicas 1", sh, kind, c.peerMiB),
				Want: "0 with replication", Got: fmt.Sprintf("%.1f MiB", rs/(1<<20)), Met: rs == 0, Margin: fmt.Sprintf("%.1f MiB over", rs/(1<<20))})
		if i == 0 {
			targets = append(targets, res.stream)
		}
	}
	b.WriteString("\nEverything shares this machine's cores and loopback (see the load average): the times say little about real hosts, the bytes are what the peer tier saves.\n")
	st := targets[2]
	fmt.Fprintf(&b, "\nOne peer transfer (pkg/checkpoint/peertier's client asking node 0's agent of the 2 × 2 job for one %d MiB replica file, signed, into a reader that discards it): %s; one plain TCP stream on the same loopback, the same bytes from memory, median of 3. Both share the cores with the agents and whatever else runs: compare them within one run only.\n",
		replica>>20, st.Got)
	r.Add(fmt.Sprintf("Restore from a peer: node 1 replaced, %d MiB per node", c.peerMiB), b.String())
	r.Command("spotagent run --store URI --run-id bench-peer --node-rank K --checkpoint-dir DIR --cloud none --interval 1h --log-format json [--peer-restore --peer-listen 127.0.0.1:0 --peer-advertise 127.0.0.1 [--replicas 1]] -- python3 python/examples/torchrun.py --nnodes 2 --node_rank K --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT --monitor_interval 1 bench/peer_trainer.py")
	r.Command("spotagent sidecar --store URI --run-id bench-peer --node-rank K --checkpoint-dir DIR --cloud none --interval 1h --log-format json [--peer-restore ... [--replicas 1]] (the 4 × 1 job's protocol ranks)")
	for _, t := range targets {
		r.Target(t)
	}
	return nil
}

// torchrunJob is the torchrun launcher and trainer of the 2 × 2 job.
func torchrunJob() (*peerjob.Torchrun, error) {
	t := &peerjob.Torchrun{Python: proc.TorchPython()}
	var err error
	if t.Launcher, err = filepath.Abs("python/examples/torchrun.py"); err != nil {
		return nil, err
	}
	if t.Trainer, err = filepath.Abs("bench/peer_trainer.py"); err != nil {
		return nil, err
	}
	if out, err := exec.Command(t.Python, "-c", "import torch").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s has no torch (scripts/test-deps.sh installs python3-torch): %w: %s", t.Python, err, out)
	}
	return t, nil
}

func medRange(xs []float64) string {
	lo, hi := stats.MinMax(xs)
	return fmt.Sprintf("%.2f (%.2f–%.2f)", stats.Median(xs), lo, hi)
}

type peerShapeResult struct {
	runs    map[string][]peerjob.Run1
	perRank int64
	step    int64         // the seeded checkpoint's
	stream  report.Target // 2 × 2 only
}

func storeB(x peerjob.Run1) float64 { return float64(x.StoreBytes) }

func (p peerShapeResult) col(mode string, f func(peerjob.Run1) float64) []float64 {
	var xs []float64
	for _, x := range p.runs[mode] {
		xs = append(xs, f(x))
	}
	return xs
}

func (p peerShapeResult) median(mode string, f func(peerjob.Run1) float64) float64 {
	return stats.Median(p.col(mode, f))
}

// benchPeerShape seeds sh's job (tr: under torchrun; nil: protocol
// ranks) and runs every mode; withStream: the single-transfer figure too.
// It returns the runs and the replica size.
func benchPeerShape(c *config, sh peerjob.Shape, tr *peerjob.Torchrun, withStream bool) (peerShapeResult, int64, error) {
	work := filepath.Join(c.work, fmt.Sprintf("peer-%dx%d", sh.Nodes, sh.Ranks))
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return peerShapeResult{}, 0, err
	}
	if os.Getenv("SPOTBENCH_KEEP_WORK") == "" { // set: keep the agents' logs
		defer os.RemoveAll(work)
	}
	srv, err := s3test.Start("bench-peer")
	if err != nil {
		return peerShapeResult{}, 0, err
	}
	defer srv.Close()
	j := &peerjob.Job{Bin: c.bin, Shape: sh, Env: append(os.Environ(), srv.Env()...), URI: "s3://" + srv.Bucket + "/" + peerjob.RunID, Work: work, Torchrun: tr}
	defer j.StopSurvivors()
	perRank := int64(c.peerMiB) << 20 / int64(sh.Ranks)
	replica, shard := perRank*3/4, perRank/4
	logf("seeding: a job of %s ranks commits %d MiB per node (replica %d MiB + shard %d MiB per rank) to an in-process S3", sh, c.peerMiB, replica>>20, shard>>20)
	if err := j.Seed(replica, shard); err != nil {
		return peerShapeResult{}, 0, fmt.Errorf("seed: %w", err)
	}
	res := peerShapeResult{runs: map[string][]peerjob.Run1{}, perRank: replica + shard, step: j.Step()}
	n := 0
	one := func(m peerjob.Mode) error {
		n++
		x, err := j.Run(m, n)
		if err != nil {
			return fmt.Errorf("%s run %d: %w", m.Name, n, err)
		}
		res.runs[m.Name] = append(res.runs[m.Name], x)
		torch := ""
		if tr != nil {
			torch = fmt.Sprintf(" (torch imported %.2fs, resume_dir %.2fs)", x.Imported, x.RankRestored)
		}
		logf("%s %-18s node 1: start → restored %.2fs, → resumed %.2fs%s; survivors → resumed %.2fs; %d MiB from the store, %d MiB from peers", sh, m.Name, x.Took, x.Resumed, torch, x.Survivors, x.StoreBytes>>20, x.PeerBytes>>20)
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
