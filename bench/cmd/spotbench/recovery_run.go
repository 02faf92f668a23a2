package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// recoveryCase is one event of the recovery section.
type recoveryCase struct {
	name, label string
	periodic    bool // the job commits a periodic checkpoint before the event (nothing else would be restored)
	newMachine  bool // node 1 comes back on an empty machine
}

var recoveryCases = []recoveryCase{
	{name: "notice", label: "(a) spot notice on node 1, node 1 replaced", newMachine: true},
	{name: "lost", label: "(b) node 1 lost without notice (SIGKILL of its tree), node 1 replaced", periodic: true, newMachine: true},
	{name: "restart", label: "(c) whole-job restart on the same machines (SIGTERM to node 1's agent)"},
}

// recoveryStep is one `bench: ...` line of bench/recovery_trainer.py.
type recoveryStep struct {
	Rank     int
	Training bool               // "training": a fresh start's first step
	Resumed  int64              // first_step: the step it resumed from
	Times    map[string]float64 // first_step: Unix times by name (first_step, started, imported, pg, connected, restored, loaded)
}

var recoveryTimeNames = []string{"started", "imported", "pg", "connected", "restored", "loaded"}

// parseRecoveryLine reads one trainer line; ok false: not one.
func parseRecoveryLine(text string) (recoveryStep, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(text), "bench: ")
	if !ok {
		return recoveryStep{}, false
	}
	f := strings.Fields(rest)
	var s recoveryStep
	var err error
	switch {
	case len(f) == 5 && f[0] == "training" && f[1] == "rank" && f[3] == "step": // training rank R step N
		s.Training = true
		s.Rank, err = strconv.Atoi(f[2])
	case len(f) == 6+2*len(recoveryTimeNames) && f[0] == "first_step" && f[2] == "rank" && f[4] == "resumed":
		s.Times = map[string]float64{}
		s.Times["first_step"], err = strconv.ParseFloat(f[1], 64)
		if err == nil {
			s.Rank, err = strconv.Atoi(f[3])
		}
		if err == nil {
			s.Resumed, err = strconv.ParseInt(f[5], 10, 64)
		}
		for i, name := range recoveryTimeNames {
			if err != nil {
				break
			}
			if f[6+2*i] != name {
				return recoveryStep{}, false
			}
			s.Times[name], err = strconv.ParseFloat(f[7+2*i], 64)
		}
	default:
		return recoveryStep{}, false
	}
	return s, err == nil
}

// recoveryMarks are one run's instants.
type recoveryMarks struct {
	Event   time.Time      // notice exposed, SIGKILL, SIGTERM
	Detect  time.Time      // node 1's "checkpoint requested"; lost: node 0's verdict
	Commit  time.Time      // the later "checkpoint committed" (zero: lost)
	Exited  time.Time      // the last surviving agent's exit
	Restart time.Time      // every agent started again
	Steps   []recoveryStep // every rank's first resumed step
}

// recoveryRun is one run's breakdown, seconds, and the restored bytes.
type recoveryRun struct {
	Detect, Commit, Exit, Delay  float64 // event → detected; → committed; → survivors exited; → restarted
	Restore, Boot, Loaded, First float64 // from the restart: slowest node restored; slowest rank connected, loaded, first resumed step
	Import                       float64 // the slowest rank's `import torch` (its process start → imported)
	Total                        float64 // event → every rank's first resumed step
	Bytes                        [2][3]int64
	Local, Peer, Store           int64 // all nodes together
	Step                         int64 // the step resumed
	Codes                        []int // the surviving agents' exit codes
	Load                         float64
	DelayModel                   time.Duration
}

// recoveryFrom computes the breakdown from the marks and each node's
// "restored checkpoint" line; x carries the load and exit codes.
func recoveryFrom(cs recoveryCase, m recoveryMarks, restored []proc.LogLine, delay time.Duration, x recoveryRun) (recoveryRun, error) {
	sec := func(a, b time.Time) float64 { return b.Sub(a).Seconds() }
	unix := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	if len(m.Steps) != 4 || len(restored) != 2 {
		return x, fmt.Errorf("%d first resumed steps and %d restores, want 4 and 2", len(m.Steps), len(restored))
	}
	x.DelayModel = delay
	x.Detect = sec(m.Event, m.Detect)
	from := m.Detect
	if !m.Commit.IsZero() {
		x.Commit, from = sec(m.Detect, m.Commit), m.Commit
	}
	x.Exit = sec(from, m.Exited)
	x.Delay = sec(m.Exited, m.Restart)
	num := func(l proc.LogLine, k string) int64 { f, _ := l.Raw[k].(float64); return int64(f) }
	for k, l := range restored {
		x.Restore = max(x.Restore, sec(m.Restart, l.At))
		x.Bytes[k] = [3]int64{num(l, "local_bytes"), num(l, "peer_bytes"), num(l, "store_bytes")}
		x.Local, x.Peer, x.Store = x.Local+x.Bytes[k][0], x.Peer+x.Bytes[k][1], x.Store+x.Bytes[k][2]
		if k == 0 {
			x.Step = num(l, "step")
		} else if s := num(l, "step"); s != x.Step {
			return x, fmt.Errorf("node 0 restored step %d, node 1 step %d", x.Step, s)
		}
	}
	r0 := unix(m.Restart)
	last := 0.0
	for _, s := range m.Steps {
		if s.Resumed != x.Step {
			return x, fmt.Errorf("rank %d resumed step %d, the agents restored step %d", s.Rank, s.Resumed, x.Step)
		}
		x.Boot = max(x.Boot, s.Times["connected"]-r0)
		x.Import = max(x.Import, s.Times["imported"]-s.Times["started"])
		x.Loaded = max(x.Loaded, s.Times["loaded"]-r0)
		x.First = max(x.First, s.Times["first_step"]-r0)
		last = max(last, s.Times["first_step"])
	}
	x.Total = last - unix(m.Event)
	return x, nil
}

// recoveryReport is the section's text: the table, what was modelled,
// and the load.
func recoveryReport(runs map[string][]recoveryRun, mib int, delay time.Duration, python string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "A job of 2 nodes × 2 ranks on this machine: `spotagent run --node-rank K` per node (`--peer-restore --replicas 1`, a file store, `--cloud aws` against a fake metadata server, `--poll-interval 1s`) around the real torchrun (`python/examples/torchrun.py`, %s), ranks running `bench/recovery_trainer.py` (train_ddp.py's loop: DDP, gloo, CPU; %d MiB per node in each checkpoint: a random payload and the model's state per rank). Once every rank trains, one event; the bench waits for every surviving agent to exit, waits the **modelled restart delay, %v from the last agent's exit** (the JobSet controller's whole-set recreation: 1.9–2.1 s from a rank's exit 75 to the new set's pods at each of 8 interruptions with the real controller, deploy/README.md \"Restart delay\", `TestK8sJobSetController`), then starts every node's agent again at once, as a JobSet recreates every pod; node 1 on an empty machine for (a) and (b), on its own for (c). Seconds, medians of n runs (min–max of the total):\n\n", python, mib, delay)
	b.WriteString("| case | n | event → detected | → committed | → survivors exited (codes) | → restarted | restart → restored (slowest node) | restart → rank booted (slowest) | of which `import torch` | restart → first resumed step | **event → every rank's first resumed step** | restored from, node 0 | node 1 | load (1 min) |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, cs := range recoveryCases {
		xs := runs[cs.name]
		if len(xs) == 0 {
			continue
		}
		col := func(f func(recoveryRun) float64) []float64 {
			var v []float64
			for _, x := range xs {
				v = append(v, f(x))
			}
			return v
		}
		med := func(f func(recoveryRun) float64) string { return fmt.Sprintf("%.2f", stats.Median(col(f))) }
		commit := med(func(x recoveryRun) float64 { return x.Commit })
		if cs.name == "lost" {
			commit = "— (the last periodic one stands)"
		}
		codes := map[int]int{}
		for _, x := range xs {
			for _, c := range x.Codes {
				codes[c]++
			}
		}
		tot := col(func(x recoveryRun) float64 { return x.Total })
		lo, hi := stats.MinMax(tot)
		loadLo, loadHi := stats.MinMax(col(func(x recoveryRun) float64 { return x.Load }))
		fmt.Fprintf(&b, "| %s | %d | %.3f | %s | %s (%s) | %s | %s | %s | %s | %s | **%.2f** (%.2f–%.2f) | %s | %s | %.1f–%.1f |\n", cs.label, len(xs),
			stats.Median(col(func(x recoveryRun) float64 { return x.Detect })), commit,
			med(func(x recoveryRun) float64 { return x.Exit }), codeList(codes),
			med(func(x recoveryRun) float64 { return x.Delay }), med(func(x recoveryRun) float64 { return x.Restore }),
			med(func(x recoveryRun) float64 { return x.Boot }), med(func(x recoveryRun) float64 { return x.Import }),
			med(func(x recoveryRun) float64 { return x.First }),
			stats.Median(tot), lo, hi, tierBytes(xs, 0), tierBytes(xs, 1), loadLo, loadHi)
	}
	b.WriteString("\n*detected*: (a) node 1's agent asks its ranks for the interruption checkpoint (\"checkpoint requested\"; it reads `spot/instance-action` every `--poll-interval`); (b) node 0's agent's verdict (its ranks' sockets reset: \"a rank of this node ended on an error\", or its heartbeats' silence, whichever first); (c) node 1's agent asks for the shutdown checkpoint. *committed*: the later agent's \"checkpoint committed\" (the job-wide commit). *survivors exited*: after the commit (a, c) or the verdict (b), the last surviving agent's exit (exit codes: every node's in a, c; node 0's in b). *restarted*: the modelled delay as slept. From the restart (every agent started at once): *restored*: the slower node's \"restored checkpoint\"; *rank booted*: the slowest rank's `agent.connect()` returned (torchrun's start and rendezvous, python, `import torch`, `init_process_group`); *of which `import torch`*: the slowest rank's, from its python's start (CPU-bound: it shows how loaded the machine was); the restore runs beside it, and a rank waits for it in `agent.resume_dir`; *first resumed step*: the slowest rank's first step after loading its files (the step's all_reduce waits for every rank of the job). *restored from*: each node's bytes by tier, from its agent's \"restored checkpoint\" line (local: its own machine's copy; peer: another node's agent; store: the store), medians.\n")
	return b.String()
}

// tierBytes is node k's median restored bytes per tier, the tiers it used.
func tierBytes(xs []recoveryRun, k int) string {
	var parts []string
	for t, name := range []string{"local", "peer", "store"} {
		var v []float64
		for _, x := range xs {
			v = append(v, float64(x.Bytes[k][t]))
		}
		if m := stats.Median(v); m > 0 {
			parts = append(parts, fmt.Sprintf("%.1f MiB %s", m/(1<<20), name))
		}
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, " + ")
}

func codeList(codes map[int]int) string {
	var keys []int
	for c := range codes {
		keys = append(keys, c)
	}
	sort.Ints(keys)
	var cs []string
	for _, c := range keys {
		cs = append(cs, fmt.Sprintf("%d × %d", c, codes[c]))
	}
	return strings.Join(cs, ", ")
}
