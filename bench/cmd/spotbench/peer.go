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

// The peer section (issue 38 item 2): a job of 2 nodes × 2 ranks (and
// one of 4 × 1) commits one checkpoint (each rank: a replica file, the
// same bytes on every rank as data-parallel weights are, and a shard of
// its own); every machine is lost; the survivors come back on their
// machines (local tier), node 1 on an empty one. Measured: node 1's
// `spotagent sidecar` started → "restored checkpoint", each node's agent
// started → every rank welcomed with the resume (its files readable), and
// the bytes node 1 read from the store, without the peer tier (today: the
// store) and with it (--peer-restore, and --replicas 1).

const (
	peerRun  = "bench-peer"
	peerStep = 500
	peerLost = 1 // the node replaced by an empty machine
)

// peerShape is a job's shape: nodes × ranks per node.
type peerShape struct{ nodes, ranks int }

func (s peerShape) String() string { return fmt.Sprintf("%d × %d", s.nodes, s.ranks) }

// peerMode is how the job comes back: store (today: node 1 reads
// everything from the store), peer (--peer-restore), peer and --replicas 1.
type peerMode struct {
	name           string
	peer, replicas bool
}

var peerModes = []peerMode{{"store", false, false}, {"peer", true, false}, {"peer, --replicas 1", true, true}}

type peerRun1 struct {
	took      float64 // node 1: agent start → restored, s
	resumed   float64 // node 1: agent start → every rank welcomed with the resume, its files readable, s
	survivors float64 // the other nodes (local tier): the slowest one's agent start → every rank resumed, s
	// survivorStore: the bytes the survivors read from the store, all together (their local tier: 0)
	survivorStore int64
	storeBytes    int64
	peerBytes     int64
}

func benchPeer(c *config, r *report.Report) error {
	// The 2 × 2 job's part of node 1 is used once more for the single
	// transfer figure; the 4 × 1 job runs beside it.
	var lines []string
	var targets []report.Target
	var replica int64
	for i, sh := range []peerShape{{2, 2}, {4, 1}} {
		res, rep, err := benchPeerShape(c, sh, i == 0)
		if err != nil {
			return fmt.Errorf("%s job: %w", sh, err)
		}
		if i == 0 {
			replica = rep
		}
		for _, m := range peerModes {
			runs := res.runs[m.name]
			var t, e, s, sb, pb, vb []float64
			for _, x := range runs {
				t, e, s = append(t, x.took), append(e, x.resumed), append(s, x.survivors)
				sb, pb = append(sb, float64(x.storeBytes)), append(pb, float64(x.peerBytes))
				vb = append(vb, float64(x.survivorStore))
			}
			job := make([]float64, len(runs))
			for j, x := range runs {
				job[j] = max(x.resumed, x.survivors)
			}
			lines = append(lines, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %.1f MiB | %.1f MiB | %.1f MiB |", sh, m.name, medRange(t), medRange(e), medRange(s), medRange(job), stats.Median(sb)/(1<<20), stats.Median(pb)/(1<<20), stats.Median(vb)/(1<<20)))
		}
		part := float64(sh.ranks) * float64(res.perRank)
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
		c.peerMiB, peerStep, max(3, c.e2eReps))
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
	runs    map[string][]peerRun1
	perRank int64
	stream  report.Target // 2 × 2 only
}

func storeB(x peerRun1) float64 { return float64(x.storeBytes) }

func (p peerShapeResult) median(mode string, f func(peerRun1) float64) float64 {
	var xs []float64
	for _, x := range p.runs[mode] {
		xs = append(xs, f(x))
	}
	return stats.Median(xs)
}

// peerJob is one shape's job on this machine.
type peerJob struct {
	c         *config
	sh        peerShape
	env       []string
	uri, work string
	files     map[int][2]int64 // rank → replica, shard size
	survivors []*proc.Agent
	ranks     []*jobrank.Rank // the survivors' ranks, connected
}

// benchPeerShape seeds sh's job and runs every mode; withStream: the
// single-transfer figure too. It returns the runs and the replica size.
func benchPeerShape(c *config, sh peerShape, withStream bool) (peerShapeResult, int64, error) {
	work := filepath.Join(c.work, fmt.Sprintf("peer-%dx%d", sh.nodes, sh.ranks))
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
	j := &peerJob{c: c, sh: sh, env: append(os.Environ(), srv.Env()...), uri: "s3://" + srv.Bucket + "/" + peerRun, work: work}
	defer j.stopSurvivors()
	perRank := int64(c.peerMiB) << 20 / int64(sh.ranks)
	replica, shard := perRank*3/4, perRank/4
	logf("seeding: a job of %s ranks commits %d MiB per node (replica %d MiB + shard %d MiB per rank) to an in-process S3", sh, c.peerMiB, replica>>20, shard>>20)
	if err := j.seed(replica, shard); err != nil {
		return peerShapeResult{}, 0, fmt.Errorf("seed: %w", err)
	}
	res := peerShapeResult{runs: map[string][]peerRun1{}, perRank: replica + shard}
	n := 0
	one := func(m peerMode) error {
		n++
		x, err := j.run(m, n)
		if err != nil {
			return fmt.Errorf("%s run %d: %w", m.name, n, err)
		}
		res.runs[m.name] = append(res.runs[m.name], x)
		logf("%s %-18s node 1: start → restored %.2fs, → resumed %.2fs; survivors → resumed %.2fs; %d MiB from the store, %d MiB from peers", sh, m.name, x.took, x.resumed, x.survivors, x.storeBytes>>20, x.peerBytes>>20)
		return nil
	}
	for rep := range max(3, c.e2eReps) {
		order := []peerMode{peerModes[0], peerModes[1]}
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
		if err := one(peerModes[2]); err != nil {
			return res, 0, err
		}
	}
	if withStream { // node 0 of the last run serves still
		rates, err := peerStream(srv, j.uri)
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

func (j *peerJob) stopSurvivors() {
	for _, r := range j.ranks {
		r.C.Close()
	}
	for _, a := range j.survivors {
		a.Kill()
	}
	j.ranks, j.survivors = nil, nil
}

func (j *peerJob) sock(k int) string { return filepath.Join(j.work, fmt.Sprintf("n%d.sock", k)) }

// startAgent starts node k's sidecar (name: its log's).
func (j *peerJob) startAgent(ckpt string, k int, m peerMode, name string) (*proc.Agent, error) {
	os.Remove(j.sock(k)) // a killed agent's socket: a rank dials the new agent's only
	args := []string{"sidecar", "--store", j.uri, "--run-id", peerRun, "--checkpoint-dir", ckpt,
		"--socket", j.sock(k), "--cloud", "none", "--log-format", "json",
		"--node-rank", strconv.Itoa(k), "--interval", "1h"}
	if name == "seed" {
		args[len(args)-1] = "300ms" // the seeding job asks for its checkpoint at once
	}
	if m.peer {
		args = append(args, "--peer-restore", "--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1")
	}
	if m.replicas {
		args = append(args, "--replicas", "1")
	}
	return proc.StartAgent(j.c.bin, args, j.env, filepath.Join(j.work, fmt.Sprintf("agent-%d-%s.log", k, name)))
}

// seed runs the job once: every agent, every rank, one checkpoint
// committed and kept in each node's local tier (and, --replicas 1, a copy
// of another node's part); then every machine is lost.
func (j *peerJob) seed(replica, shard int64) error {
	var agents []*proc.Agent
	for k := range j.sh.nodes {
		a, err := j.startAgent(filepath.Join(j.work, fmt.Sprintf("n%d", k)), k, peerModes[2], "seed")
		if err != nil {
			return err
		}
		defer a.Kill()
		agents = append(agents, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	world := j.sh.nodes * j.sh.ranks
	var ranks []*jobrank.Rank
	for rk := range world {
		br, err := jobrank.Dial(ctx, j.sock(rk/j.sh.ranks), rk, world, j.sh.ranks)
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
	if err := jobrank.SaveStep(ctx, ranks, peerStep, j.sh.ranks, files); err != nil {
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
	j.files = map[int][2]int64{}
	for rk := range world {
		j.files[rk] = [2]int64{replica, shard}
	}
	return nil
}

// resumeNode dials node k's ranks and returns when every one was welcomed
// naming the seeded step with its files readable at their sizes.
func (j *peerJob) resumeNode(ctx context.Context, k int) ([]*jobrank.Rank, time.Time, error) {
	world := j.sh.nodes * j.sh.ranks
	type got struct {
		r   *jobrank.Rank
		err error
	}
	ch := make(chan got, j.sh.ranks)
	for lr := range j.sh.ranks {
		rk := k*j.sh.ranks + lr
		go func() {
			r, err := jobrank.Dial(ctx, j.sock(k), rk, world, j.sh.ranks)
			if err == nil {
				err = j.checkResume(r)
			}
			ch <- got{r, err}
		}()
	}
	var ranks []*jobrank.Rank
	var err error
	for range j.sh.ranks {
		g := <-ch
		if g.r != nil {
			ranks = append(ranks, g.r)
		}
		if g.err != nil && err == nil {
			err = g.err
		}
	}
	at := time.Now()
	if err != nil {
		for _, r := range ranks {
			r.C.Close()
		}
		return nil, at, fmt.Errorf("node %d: %w", k, err)
	}
	return ranks, at, nil
}

// checkResume: r's welcome names step peerStep, and its two files are in
// the welcome's directory, readable, at their sizes.
func (j *peerJob) checkResume(r *jobrank.Rank) error {
	res := r.Welcome.Resume
	if res == nil || r.Welcome.Restore != "" {
		return fmt.Errorf("rank %d: welcome without a final resume (restore %q)", r.N, r.Welcome.Restore)
	}
	if res.Step != peerStep {
		return fmt.Errorf("rank %d: resumed step %d, want %d", r.N, res.Step, peerStep)
	}
	sizes := j.files[r.N]
	for i, name := range []string{fmt.Sprintf("replica-%d.bin", r.N), fmt.Sprintf("shard-%d.bin", r.N)} {
		f, err := os.Open(filepath.Join(res.Dir, name))
		if err != nil {
			return fmt.Errorf("rank %d: %w", r.N, err)
		}
		fi, err := f.Stat()
		if err == nil && fi.Size() != sizes[i] {
			err = fmt.Errorf("%s: %d bytes, want %d", name, fi.Size(), sizes[i])
		}
		if err == nil {
			_, err = f.Read(make([]byte, 1))
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("rank %d: %w", r.N, err)
		}
	}
	return nil
}

// run is one recovery: the survivors start again on their machines and
// resume from their local tier; once they serve (peer modes), node 1
// starts on an empty machine and resumes.
func (j *peerJob) run(m peerMode, n int) (peerRun1, error) {
	j.stopSurvivors()
	exec.Command("sync").Run() // what an earlier run left dirty is not this run's
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var x peerRun1
	type surv struct {
		k int
		a *proc.Agent
	}
	var ss []surv
	for k := range j.sh.nodes {
		if k == peerLost {
			continue
		}
		a, err := j.startAgent(filepath.Join(j.work, fmt.Sprintf("n%d", k)), k, m, fmt.Sprintf("run%d", n))
		if err != nil {
			return x, err
		}
		j.survivors = append(j.survivors, a)
		ss = append(ss, surv{k, a})
	}
	type resumed struct {
		ranks []*jobrank.Rank
		took  float64
		err   error
	}
	ch := make(chan resumed, len(ss))
	for _, s := range ss { // every survivor's ranks at once, as torchrun starts them
		go func() {
			ranks, at, err := j.resumeNode(ctx, s.k)
			ch <- resumed{ranks, at.Sub(s.a.Start).Seconds(), err}
		}()
	}
	var err error
	for range ss {
		g := <-ch
		j.ranks = append(j.ranks, g.ranks...)
		x.survivors = max(x.survivors, g.took)
		if g.err != nil && err == nil {
			err = g.err
		}
	}
	if err != nil {
		return x, err
	}
	for _, s := range ss { // each survivor restored from its local tier, and (peer modes) serves it
		want := map[string]func(proc.LogLine) bool{"restored checkpoint": nil}
		if m.peer {
			want["peer tier: serving this node's local copies"] = func(l proc.LogLine) bool {
				h, _ := l.Raw["holds"].([]any)
				return len(h) > 0
			}
		}
		got, err := s.a.WaitEach(time.Minute, want)
		if err != nil {
			return x, err
		}
		f, _ := got["restored checkpoint"].Raw["store_bytes"].(float64)
		x.survivorStore += int64(f)
	}
	ckpt := filepath.Join(j.work, fmt.Sprintf("n1-run%d", n))
	defer os.RemoveAll(ckpt)
	a, err := j.startAgent(ckpt, peerLost, m, fmt.Sprintf("run%d", n))
	if err != nil {
		return x, err
	}
	defer a.Kill()
	ranks, at, err := j.resumeNode(ctx, peerLost)
	if err != nil {
		return x, err
	}
	for _, r := range ranks {
		defer r.C.Close()
	}
	l, err := a.WaitMsg("restored checkpoint", time.Minute, nil)
	if err != nil {
		return x, err
	}
	num := func(k string) int64 { f, _ := l.Raw[k].(float64); return int64(f) }
	if step := num("step"); step != peerStep {
		return x, fmt.Errorf("node 1 restored step %d, want %d", step, peerStep)
	}
	x.took, x.resumed = l.At.Sub(a.Start).Seconds(), at.Sub(a.Start).Seconds()
	x.storeBytes, x.peerBytes = num("store_bytes"), num("peer_bytes")
	return x, nil
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
