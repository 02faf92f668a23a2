package peerjob

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/proc"
)

// Torchrun runs the job's ranks as real torchrun workers: each node's
// agent is `spotagent run --node-rank K -- python3 torchrun.py --nnodes N
// --node_rank K --nproc_per_node R ... peer_trainer.py` (Debian's torch
// 1.13, gloo on the CPU). The trainer (bench/peer_trainer.py) saves
// replica-<rank>.pt (the same bytes on every rank) and shard-<rank>.pt,
// and once resumed prints its first resumed step.
type Torchrun struct {
	Python   string // an interpreter with torch
	Launcher string // python/examples/torchrun.py
	Trainer  string // bench/peer_trainer.py
}

// Timeout bounds each wait of a torchrun job (seed: every rank saved and
// every copy kept; a run: every node's first resumed step).
const Timeout = 10 * time.Minute

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// trainerLine is one `bench: ...` line of the trainer.
type trainerLine struct {
	kind  string // "saved", "first_step", "pid"
	rank  int
	step  int64
	pid   int
	times map[string]float64 // first_step: Unix times by name
}

func parseTrainer(text string) (trainerLine, bool) {
	rest, ok := strings.CutPrefix(text, "bench: ")
	if !ok {
		return trainerLine{}, false
	}
	f := strings.Fields(rest)
	var t trainerLine
	var err error
	switch {
	case len(f) == 4 && f[0] == "rank" && f[2] == "pid": // rank R pid P
		t.kind = "pid"
		if t.rank, err = strconv.Atoi(f[1]); err == nil {
			t.pid, err = strconv.Atoi(f[3])
		}
	case len(f) == 5 && f[0] == "saved": // saved step N rank R
		t.kind = "saved"
		if t.step, err = strconv.ParseInt(f[2], 10, 64); err == nil {
			t.rank, err = strconv.Atoi(f[4])
		}
	case len(f) == 16 && f[0] == "first_step": // first_step T rank R resumed N name T ...
		t.kind, t.times = "first_step", map[string]float64{}
		var at float64
		at, err = strconv.ParseFloat(f[1], 64)
		t.times["first_step"] = at
		if err == nil {
			t.rank, err = strconv.Atoi(f[3])
		}
		if err == nil {
			t.step, err = strconv.ParseInt(f[5], 10, 64)
		}
		for i := 6; i+1 < len(f) && err == nil; i += 2 {
			t.times[f[i]], err = strconv.ParseFloat(f[i+1], 64)
		}
	default:
		return trainerLine{}, false
	}
	return t, err == nil
}

// since is the seconds from start to the Unix time at.
func since(start time.Time, at float64) float64 {
	return at - float64(start.UnixNano())/1e9
}

// nodeRanks waits for every rank of the node behind a: with want
// "first_step", their first resumed step at step (the slowest rank's
// times returned, by name, as seconds from a's start); with "saved", their
// saved step (returned as "step"). Their pids are kept for reap. It waits
// too for the agent's first line of each message in msgs, and puts it there.
func (j *Job) nodeRanks(a *proc.Agent, want string, step int64, msgs map[string]*proc.LogLine) (map[string]float64, error) {
	slow := map[string]float64{}
	seen := map[int]bool{}
	left := len(msgs)
	err := a.Until(Timeout, func(l proc.LogLine) (bool, error) {
		if p, ok := msgs[l.Msg()]; ok && p.Raw == nil {
			*p = l
			left--
			return len(seen) == j.Shape.Ranks && left == 0, nil
		}
		t, ok := parseTrainer(l.Text)
		if !ok {
			return false, nil
		}
		switch {
		case t.kind == "pid":
			j.pids = append(j.pids, t.pid)
		case t.kind != want || seen[t.rank]:
		case want == "saved":
			if step, ok := slow["step"]; ok && int64(step) != t.step {
				return false, fmt.Errorf("rank %d saved step %d, another rank %d", t.rank, t.step, int64(step))
			}
			slow["step"], seen[t.rank] = float64(t.step), true
		default:
			if t.step != step {
				return false, fmt.Errorf("rank %d resumed step %d, want %d", t.rank, t.step, step)
			}
			for k, v := range t.times {
				slow[k] = max(slow[k], since(a.Start, v))
			}
			seen[t.rank] = true
		}
		return len(seen) == j.Shape.Ranks && left == 0, nil
	})
	return slow, err
}

// seedTorchrun runs the job once under torchrun with --replicas 1: every
// rank saves its files at the first request, the agents commit them and
// keep their local copies and a copy of another node's part; then every
// machine is lost.
func (j *Job) seedTorchrun(replica, shard int64) error {
	defer j.StopSurvivors()
	j.Env = append(j.Env, "PEER_REPLICA_BYTES="+strconv.FormatInt(replica, 10), "PEER_SHARD_BYTES="+strconv.FormatInt(shard, 10), "PYTHONUNBUFFERED=1")
	port, err := freePort()
	if err != nil {
		return err
	}
	for k := range j.Shape.Nodes {
		a, err := j.startAgent(filepath.Join(j.Work, fmt.Sprintf("n%d", k)), k, Modes[2], "seed", port)
		if err != nil {
			return err
		}
		j.survivors = append(j.survivors, a)
	}
	for k, a := range j.survivors {
		// Every rank waited for the commit: the copies follow it.
		saved, err := j.nodeRanks(a, "saved", 0, map[string]*proc.LogLine{
			"kept a local copy of the committed checkpoint":                  {},
			"kept a copy of another node's part of the committed checkpoint": {},
		})
		if err != nil {
			return fmt.Errorf("node %d: %w", k, err)
		}
		if k == 0 {
			j.step = int64(saved["step"])
		} else if int64(saved["step"]) != j.step {
			return fmt.Errorf("node %d saved step %d, node 0 step %d", k, int64(saved["step"]), j.step)
		}
	}
	j.files = map[int][2]int64{}
	return nil
}

// runTorchrun is one recovery under torchrun: the survivors' agents start
// again on their machines (their local tier) around a new torchrun, and
// once each restored (and, peer modes, serves), node 1's agent starts on an
// empty machine; every rank loads its files and takes a first step, whose
// all_reduce waits for every rank of the job. Every agent is left running
// (StopSurvivors, or the next run, takes the machines away).
func (j *Job) runTorchrun(m Mode, n int) (Run1, error) {
	j.StopSurvivors()
	exec.Command("sync").Run() // what an earlier run left dirty is not this run's
	var x Run1
	port, err := freePort()
	if err != nil {
		return x, err
	}
	survivors := map[int]*proc.Agent{}
	for k := range j.Shape.Nodes {
		if k == Lost {
			continue
		}
		a, err := j.startAgent(filepath.Join(j.Work, fmt.Sprintf("n%d", k)), k, m, fmt.Sprintf("run%d", n), port)
		if err != nil {
			return x, err
		}
		j.survivors = append(j.survivors, a)
		survivors[k] = a
	}
	for k, a := range survivors { // each restored from its local tier, and (peer modes) serves it
		want := map[string]func(proc.LogLine) bool{"restored checkpoint": nil}
		if m.Peer {
			want["peer tier: serving this node's local copies"] = func(l proc.LogLine) bool {
				h, _ := l.Raw["holds"].([]any)
				return len(h) > 0
			}
		}
		got, err := a.WaitEach(Timeout, want)
		if err != nil {
			return x, fmt.Errorf("node %d: restore: %w", k, err)
		}
		l := got["restored checkpoint"]
		f, _ := l.Raw["store_bytes"].(float64)
		x.SurvivorStore += int64(f)
		x.SurvRestored = max(x.SurvRestored, l.At.Sub(a.Start).Seconds())
	}
	ckpt := filepath.Join(j.Work, fmt.Sprintf("n1-run%d", n))
	defer os.RemoveAll(ckpt)
	a, err := j.startAgent(ckpt, Lost, m, fmt.Sprintf("run%d", n), port)
	if err != nil {
		return x, err
	}
	j.survivors = append(j.survivors, a)
	var l proc.LogLine
	t, err := j.nodeRanks(a, "first_step", j.step, map[string]*proc.LogLine{"restored checkpoint": &l})
	if err != nil {
		return x, fmt.Errorf("node 1: restore and first resumed step: %w", err)
	}
	num := func(k string) int64 { f, _ := l.Raw[k].(float64); return int64(f) }
	if step := num("step"); step != j.step {
		return x, fmt.Errorf("node 1 restored step %d, want %d", step, j.step)
	}
	x.Took = l.At.Sub(a.Start).Seconds()
	x.StoreBytes, x.PeerBytes = num("store_bytes"), num("peer_bytes")
	x.Resumed, x.Started, x.Imported, x.RankRestored, x.Loaded = t["first_step"], t["started"], t["imported"], t["restored"], t["loaded"]
	for k, s := range survivors {
		t, err := j.nodeRanks(s, "first_step", j.step, nil)
		if err != nil {
			return x, fmt.Errorf("node %d: first resumed step: %w", k, err)
		}
		x.Survivors = max(x.Survivors, t["first_step"])
	}
	return x, nil
}
