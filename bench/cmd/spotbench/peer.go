package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/jobrank"
	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/bench/internal/stream"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/liveness"
)

// The peer section (issue 38 item 2): a job of 2 nodes × 2 ranks commits
// one checkpoint (each rank: a replica file, the same bytes on every rank
// as data-parallel weights are, and a shard of its own); both machines are
// lost; node 0 comes back on its machine, node 1 on an empty one. Measured
// on node 1: `spotagent sidecar` started → "restored checkpoint", and the
// bytes it read from the store, without the peer tier (today: the store)
// and with it (--peer-restore).

const (
	peerRun   = "bench-peer"
	peerStep  = 500
	peerNodes = 2
	peerRanks = 2 // per node
)

type peerRun1 struct {
	took       float64 // agent start → restored, s
	storeBytes int64
	peerBytes  int64
}

func benchPeer(c *config, r *report.Report) error {
	work := filepath.Join(c.work, "peer")
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	srv, err := s3test.Start("bench-peer")
	if err != nil {
		return err
	}
	defer srv.Close()
	env := append(os.Environ(), srv.Env()...)
	uri := "s3://" + srv.Bucket + "/" + peerRun
	// Each rank: a replica file of 3/4 of its bytes and a shard of 1/4.
	perRank := int64(c.peerMiB) << 20 / peerRanks
	replica, shard := perRank*3/4, perRank/4
	logf("seeding: a job of %d × %d ranks commits %d MiB per node (replica %d MiB + shard %d MiB per rank) to an in-process S3", peerNodes, peerRanks, c.peerMiB, replica>>20, shard>>20)
	if err := seedPeerJob(c, env, uri, work, replica, shard); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	// Node 0 back on its machine, serving its copy, for every run (its
	// copy of node 1's part, kept by the seeding job's --replicas 1, is not
	// offered: this node 0 runs without --replicas).
	n0, err := startNode0(c, env, uri, work, false)
	if err != nil {
		return err
	}
	var store, peer, replicated []peerRun1
	n := 0
	for rep := range max(3, c.e2eReps) {
		order := []bool{false, true}
		if rep%2 == 1 {
			order = []bool{true, false}
		}
		for _, withPeer := range order {
			n++
			res, err := onePeerRestore(c, env, uri, work, n, withPeer)
			if err != nil {
				return err
			}
			mode := "store"
			if withPeer {
				mode, peer = "peer", append(peer, res)
			} else {
				store = append(store, res)
			}
			logf("%-5s node 1: start → restored %.2fs, %d MiB from the store, %d MiB from node 0", mode, res.took, res.storeBytes>>20, res.peerBytes>>20)
		}
	}
	n0.Kill()
	// Node 0 again, with --replicas 1: it offers its copy of node 1's part.
	if n0, err = startNode0(c, env, uri, work, true); err != nil {
		return err
	}
	defer n0.Kill()
	for range max(3, c.e2eReps) {
		n++
		res, err := onePeerRestore(c, env, uri, work, n, true)
		if err != nil {
			return err
		}
		replicated = append(replicated, res)
		logf("peer, --replicas 1 node 1: start → restored %.2fs, %d MiB from the store, %d MiB from node 0", res.took, res.storeBytes>>20, res.peerBytes>>20)
	}
	peerRates, err := peerStream(srv, uri)
	if err != nil {
		return err
	}
	var tcps []float64
	for range 3 {
		t, err := stream.Loopback(replica)
		if err != nil {
			return err
		}
		tcps = append(tcps, t)
	}
	tcp := stats.Median(tcps)
	var b strings.Builder
	fmt.Fprintf(&b, "Two `spotagent sidecar --node-rank K` agents (each its own checkpoint directory; the ranks played over the real protocol by spotbench) commit one checkpoint of %d MiB per node to an in-process S3 (gofakes3 on loopback): each of the 2 ranks per node saves a replica file of %d MiB (the same bytes on every rank, as data-parallel weights are) and a shard of %d MiB of its own. Both machines are lost (SIGKILL); node 0 comes back on its machine (restores from its local tier, then serves it); node 1 comes back on an empty machine, each run a fresh directory. Measured on node 1: agent started → its \"restored checkpoint\" line, and the bytes it read from the store and from node 0 (the agent's own counts, the ones the journal keeps). *store*: node 1 without `--peer-restore` (everything from the store); *peer*: with it (node 0 offers its own part: node 1's replica files); *peer, --replicas 1*: node 0 also offers the copy of node 1's part it kept after the commit (the seeding job ran with `--replicas 1`), so node 1's shards come from it too. %d runs per mode (store and peer alternating), medians (min–max). Everything shares this machine's cores and loopback: the times say little about two real hosts, the bytes are what the peer tier saves. \n\n",
		c.peerMiB, replica>>20, shard>>20, len(store))
	b.WriteString("| mode | agent start → restored s | bytes from the store per recovery | bytes from the peer |\n| --- | --- | --- | --- |\n")
	for _, m := range []struct {
		name string
		runs []peerRun1
	}{{"store", store}, {"peer", peer}, {"peer, --replicas 1", replicated}} {
		var t, sb, pb []float64
		for _, x := range m.runs {
			t, sb, pb = append(t, x.took), append(sb, float64(x.storeBytes)), append(pb, float64(x.peerBytes))
		}
		lo, hi := stats.MinMax(t)
		fmt.Fprintf(&b, "| %s | %.2f (%.2f–%.2f) | %.1f MiB | %.1f MiB |\n", m.name, stats.Median(t), lo, hi, stats.Median(sb)/(1<<20), stats.Median(pb)/(1<<20))
	}
	lo, hi := stats.MinMax(peerRates)
	fmt.Fprintf(&b, "\nOne peer transfer (pkg/checkpoint/peertier's client asking node 0's agent for one %d MiB replica file, signed, into a reader that discards it; %d runs): %.0f MiB/s (%.0f–%.0f); one plain TCP stream on the same loopback, the same bytes from memory, median of 3: %.0f MiB/s. Both share 2 cores with the agents and whatever else runs (see the load average): compare them within one run only.\n",
		replica>>20, len(peerRates), stats.Median(peerRates), lo, hi, tcp)
	r.Add(fmt.Sprintf("Restore from a peer: node 1 replaced, %d MiB per node", c.peerMiB), b.String())
	r.Command("spotagent sidecar --store URI --run-id bench-peer --node-rank K --checkpoint-dir DIR --cloud none --interval 1h --log-format json [--peer-restore --peer-listen 127.0.0.1:0 --peer-advertise 127.0.0.1 [--replicas 1]]")
	var ps, ss, rs []float64
	for _, x := range peer {
		ps = append(ps, float64(x.storeBytes))
	}
	for _, x := range replicated {
		rs = append(rs, float64(x.storeBytes))
	}
	for _, x := range store {
		ss = append(ss, float64(x.storeBytes))
	}
	part := float64(peerRanks * (replica + shard))
	got := stats.Median(ps)
	r.Target(report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %d MiB part, replicas on node 0", c.peerMiB),
		Want: "≤ one part without replication", Got: fmt.Sprintf("%.1f MiB (store only: %.1f MiB)", got/(1<<20), stats.Median(ss)/(1<<20)),
		Met: got <= part, Margin: fmt.Sprintf("%.1f MiB", (part-got)/(1<<20))})
	r.Target(report.Target{Name: fmt.Sprintf("bytes from the store per recovery of node 1, %d MiB part, --replicas 1", c.peerMiB),
		Want: "0 with replication", Got: fmt.Sprintf("%.1f MiB", stats.Median(rs)/(1<<20)), Met: stats.Median(rs) == 0, Margin: fmt.Sprintf("%.1f MiB over", stats.Median(rs)/(1<<20))})
	r.Target(report.Target{Name: fmt.Sprintf("one peer transfer (%d MiB file) against one TCP stream, loopback", replica>>20),
		Want: "≥ 0.9 × the TCP stream", Got: fmt.Sprintf("%.0f MiB/s (TCP %.0f MiB/s)", stats.Median(peerRates), tcp),
		Met: stats.Median(peerRates) >= 0.9*tcp, Margin: fmt.Sprintf("%.2f×", stats.Median(peerRates)/tcp)})
	return nil
}

// peerStream asks node 0's agent for node 1's first replica file, as node
// 1's restore does, 3 times after a first, and returns the rates (MiB/s).
func peerStream(srv *s3test.Server, uri string) ([]float64, error) {
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	ctx := context.Background()
	st, err := all.Open(ctx, uri, all.Options{S3Endpoint: srv.Endpoint})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	l, err := checkpoint.ReadLatest(ctx, st)
	if err != nil {
		return nil, err
	}
	m, err := checkpoint.ReadManifest(ctx, st, l.Manifest)
	if err != nil {
		return nil, err
	}
	token, err := liveness.Token(ctx, st)
	if err != nil {
		return nil, err
	}
	var f checkpoint.File
	for _, x := range m.Files {
		if x.Part == "node-1" && strings.HasPrefix(x.Path, "replica-") {
			f = x
			break
		}
	}
	var rates []float64
	buf := make([]byte, stream.CopyBufSize)
	cl := peertier.NewClient(st, peerRun, "node-1", token, 0, nil)
	for i := range 4 { // the first reads node 0's record from the store and connects: not counted
		t0 := time.Now()
		rc, err := cl.Open(ctx, m, f)
		if err != nil {
			return nil, fmt.Errorf("peer transfer: %w", err)
		}
		n, err := io.CopyBuffer(stream.Discard{}, rc, buf)
		rc.Close()
		if err != nil || n != f.Size {
			return nil, fmt.Errorf("peer transfer: %d of %d bytes: %v", n, f.Size, err)
		}
		if i > 0 {
			rates = append(rates, float64(n)/(1<<20)/time.Since(t0).Seconds())
		}
	}
	return rates, nil
}

// startNode0 starts node 0 again on its machine and waits until its record
// offers its copy.
func startNode0(c *config, env []string, uri, work string, replicas bool) (*proc.Agent, error) {
	name := "node0-again"
	var extra []string
	if replicas {
		name, extra = "node0-replicas", []string{"--replicas", "1"}
	}
	n0, err := startPeerAgent(c, env, uri, work, filepath.Join(work, "n0"), 0, true, name, extra...)
	if err != nil {
		return nil, err
	}
	if _, err := n0.WaitMsg("peer tier: serving this node's local copies", time.Minute, func(l proc.LogLine) bool {
		h, _ := l.Raw["holds"].([]any)
		return len(h) > 0
	}); err != nil {
		n0.Kill()
		return nil, err
	}
	return n0, nil
}

// startPeerAgent starts node k's sidecar (name: its log's).
func startPeerAgent(c *config, env []string, uri, work, ckpt string, k int, withPeer bool, name string, extra ...string) (*proc.Agent, error) {
	args := []string{"sidecar", "--store", uri, "--run-id", peerRun, "--checkpoint-dir", ckpt,
		"--socket", filepath.Join(work, fmt.Sprintf("n%d.sock", k)), "--cloud", "none", "--log-format", "json",
		"--node-rank", strconv.Itoa(k), "--interval", "1h"}
	if name == "seed" {
		args[len(args)-1] = "300ms" // the seeding job asks for its checkpoint at once
	}
	if withPeer {
		args = append(args, "--peer-restore", "--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1")
	}
	args = append(args, extra...)
	return proc.StartAgent(c.bin, args, env, filepath.Join(work, fmt.Sprintf("agent-%d-%s.log", k, name)))
}

// seedPeerJob runs the job once: both agents, the four ranks, one
// checkpoint committed and kept in each node's local tier; then both
// machines are lost.
func seedPeerJob(c *config, env []string, uri, work string, replica, shard int64) error {
	var agents []*proc.Agent
	for k := range peerNodes {
		a, err := startPeerAgent(c, env, uri, work, filepath.Join(work, fmt.Sprintf("n%d", k)), k, true, "seed", "--replicas", "1")
		if err != nil {
			return err
		}
		defer a.Kill()
		agents = append(agents, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	world := peerNodes * peerRanks
	var ranks []*jobrank.Rank
	for rk := range world {
		br, err := jobrank.Dial(ctx, filepath.Join(work, fmt.Sprintf("n%d.sock", rk/peerRanks)), rk, world, peerRanks)
		if err != nil {
			return err
		}
		defer br.C.Close()
		ranks = append(ranks, br)
	}
	rng := rand.NewChaCha8([32]byte{38, 2})
	rep := make([]byte, replica)
	rng.Read(rep)
	files := func(rk int) map[string][]byte {
		sh := make([]byte, shard)
		rng.Read(sh)
		return map[string][]byte{fmt.Sprintf("replica-%d.bin", rk): rep, fmt.Sprintf("shard-%d.bin", rk): sh}
	}
	if err := jobrank.SaveStep(ctx, ranks, peerStep, peerRanks, files); err != nil {
		return err
	}
	for _, a := range agents {
		if _, err := a.WaitMsg("kept a local copy of the committed checkpoint", 5*time.Minute, nil); err != nil {
			return err
		}
		if _, err := a.WaitMsg("kept a copy of another node's part of the committed checkpoint", 5*time.Minute, nil); err != nil {
			return err
		}
	}
	return nil
}

// onePeerRestore starts node 1 on an empty machine and returns its restore.
func onePeerRestore(c *config, env []string, uri, work string, n int, withPeer bool) (peerRun1, error) {
	ckpt := filepath.Join(work, fmt.Sprintf("n1-run%d", n))
	defer os.RemoveAll(ckpt)
	exec.Command("sync").Run() // what an earlier run left dirty is not this run's
	a, err := startPeerAgent(c, env, uri, work, ckpt, 1, withPeer, fmt.Sprintf("run%d", n))
	if err != nil {
		return peerRun1{}, err
	}
	defer a.Kill()
	l, err := a.WaitMsg("restored checkpoint", 5*time.Minute, nil)
	if err != nil {
		return peerRun1{}, err
	}
	num := func(k string) int64 { f, _ := l.Raw[k].(float64); return int64(f) }
	if step := num("step"); step != peerStep {
		return peerRun1{}, fmt.Errorf("node 1 restored step %d, want %d", step, peerStep)
	}
	return peerRun1{took: l.At.Sub(a.Start).Seconds(), storeBytes: num("store_bytes"), peerBytes: num("peer_bytes")}, nil
}
