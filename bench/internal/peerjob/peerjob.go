// Package peerjob is spotbench's job for the "Restore from a peer" section
// (issue 38): N nodes × R ranks, one real agent a node (each its own
// checkpoint directory and socket). The ranks are real torchrun workers
// under `spotagent run --node-rank K` (Torchrun, torchrun.go,
// bench/peer_trainer.py), or are played over the real protocol
// (bench/internal/jobrank) under `spotagent sidecar --node-rank K`. Seed
// commits one checkpoint and loses every machine; Run brings the
// survivors back on their machines and node Lost on an empty one, and
// measures.
package peerjob

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/jobrank"
	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/stream"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/liveness"
)

const (
	RunID = "bench-peer"
	Step  = 500
	Lost  = 1 // the node replaced by an empty machine
)

// Shape is a job's shape: nodes × ranks per node.
type Shape struct{ Nodes, Ranks int }

func (s Shape) String() string { return fmt.Sprintf("%d × %d", s.Nodes, s.Ranks) }

// Mode is how the job comes back: store (today: node 1 reads
// everything from the store), peer (--peer-restore), peer and --replicas 1.
type Mode struct {
	Name           string
	Peer, Replicas bool
}

var Modes = []Mode{{"store", false, false}, {"peer", true, false}, {"peer, --replicas 1", true, true}}

type Run1 struct {
	Took float64 // node 1: agent start → restored, s
	// Resumed: node 1's agent start → every rank welcomed with the resume,
	// its files readable (torchrun: every rank's first resumed step), s.
	Resumed float64
	// Survivors: the other nodes (local tier), the slowest one's agent
	// start → every rank resumed (torchrun: first resumed step), s.
	Survivors float64
	// SurvivorStore: the bytes the survivors read from the store, all together (their local tier: 0)
	SurvivorStore int64
	StoreBytes    int64
	PeerBytes     int64
	// Torchrun only, node 1's agent start → its slowest rank's process
	// started (torchrun's start and rendezvous), torch imported,
	// resume_dir returned, both files loaded (s); and the survivors' agent
	// start → "restored checkpoint" (the slowest, s).
	Started, Imported, RankRestored, Loaded, SurvRestored float64
}

// Job is one shape's job on this machine.
type Job struct {
	Bin       string // the spotagent binary
	Shape     Shape
	Env       []string // the agents' environment (the store's credentials)
	URI, Work string   // the run's store; a directory of the job's own
	// Torchrun: the ranks are real torchrun workers (torchrun.go); nil:
	// spotbench plays them over the protocol (jobrank).
	Torchrun  *Torchrun
	files     map[int][2]int64 // rank → replica, shard size
	survivors []*proc.Agent    // the agents left running (torchrun: every node's)
	ranks     []*jobrank.Rank  // the survivors' ranks, connected
	step      int64            // the seeded checkpoint's step
	pids      []int            // torchrun: the ranks' processes
}

// seed runs the job once: every agent, every rank, one checkpoint
// committed and kept in each node's local tier (and, --replicas 1, a copy
// of another node's part); then every machine is lost.
func (j *Job) Seed(replica, shard int64) error {
	if j.Torchrun != nil {
		return j.seedTorchrun(replica, shard)
	}
	var agents []*proc.Agent
	for k := range j.Shape.Nodes {
		a, err := j.startAgent(filepath.Join(j.Work, fmt.Sprintf("n%d", k)), k, Modes[2], "seed", 0)
		if err != nil {
			return err
		}
		defer a.Kill()
		agents = append(agents, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	world := j.Shape.Nodes * j.Shape.Ranks
	var ranks []*jobrank.Rank
	for rk := range world {
		br, err := jobrank.Dial(ctx, j.sock(rk/j.Shape.Ranks), rk, world, j.Shape.Ranks)
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
	if err := jobrank.SaveStep(ctx, ranks, Step, j.Shape.Ranks, files); err != nil {
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
	j.step = Step
	return nil
}

// resumeNode dials node k's ranks and returns when every one was welcomed
// naming the seeded step with its files readable at their sizes.
func (j *Job) resumeNode(ctx context.Context, k int) ([]*jobrank.Rank, time.Time, error) {
	world := j.Shape.Nodes * j.Shape.Ranks
	type got struct {
		r   *jobrank.Rank
		err error
	}
	ch := make(chan got, j.Shape.Ranks)
	for lr := range j.Shape.Ranks {
		rk := k*j.Shape.Ranks + lr
		go func() {
			r, err := jobrank.Dial(ctx, j.sock(k), rk, world, j.Shape.Ranks)
			if err == nil {
				err = j.checkResume(r)
			}
			ch <- got{r, err}
		}()
	}
	var ranks []*jobrank.Rank
	var err error
	for range j.Shape.Ranks {
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

// checkResume: r's welcome names step Step, and its two files are in
// the welcome's directory, readable, at their sizes.
func (j *Job) checkResume(r *jobrank.Rank) error {
	res := r.Welcome.Resume
	if res == nil || r.Welcome.Restore != "" {
		return fmt.Errorf("rank %d: welcome without a final resume (restore %q)", r.N, r.Welcome.Restore)
	}
	if res.Step != Step {
		return fmt.Errorf("rank %d: resumed step %d, want %d", r.N, res.Step, Step)
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
func (j *Job) Run(m Mode, n int) (Run1, error) {
	if j.Torchrun != nil {
		return j.runTorchrun(m, n)
	}
	j.StopSurvivors()
	exec.Command("sync").Run() // what an earlier run left dirty is not this run's
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var x Run1
	type surv struct {
		k int
		a *proc.Agent
	}
	var ss []surv
	for k := range j.Shape.Nodes {
		if k == Lost {
			continue
		}
		a, err := j.startAgent(filepath.Join(j.Work, fmt.Sprintf("n%d", k)), k, m, fmt.Sprintf("run%d", n), 0)
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
		x.Survivors = max(x.Survivors, g.took)
		if g.err != nil && err == nil {
			err = g.err
		}
	}
	if err != nil {
		return x, err
	}
	for _, s := range ss { // each survivor restored from its local tier, and (peer modes) serves it
		want := map[string]func(proc.LogLine) bool{"restored checkpoint": nil}
		if m.Peer {
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
		x.SurvivorStore += int64(f)
	}
	ckpt := filepath.Join(j.Work, fmt.Sprintf("n1-run%d", n))
	defer os.RemoveAll(ckpt)
	a, err := j.startAgent(ckpt, Lost, m, fmt.Sprintf("run%d", n), 0)
	if err != nil {
		return x, err
	}
	defer a.Kill()
	ranks, at, err := j.resumeNode(ctx, Lost)
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
	if step := num("step"); step != Step {
		return x, fmt.Errorf("node 1 restored step %d, want %d", step, Step)
	}
	x.Took, x.Resumed = l.At.Sub(a.Start).Seconds(), at.Sub(a.Start).Seconds()
	x.StoreBytes, x.PeerBytes = num("store_bytes"), num("peer_bytes")
	return x, nil
}

// Stream asks node 0's agent for node 1's first replica file, as node
// 1's restore does, 3 times after a first, and returns the rates (MiB/s).
func Stream(srv *s3test.Server, uri string) ([]float64, error) {
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
	cl := peertier.NewClient(st, RunID, "node-1", token, 0, nil)
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

// Step is the seeded checkpoint's step (Seed's).
func (j *Job) Step() int64 { return j.step }
