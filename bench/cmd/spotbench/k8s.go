package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// The k8s section (issue 45's figure): a JobSet's whole-set restart on the
// real control plane and the real JobSet controller, with each node's
// copies on a hostPath that outlives the pods. It runs the deploy test
// that holds the behaviour, TestK8sJobSetRestartReusesCopies
// (deploy/k8s_copies_test.go: multinode-jobset.yaml as shipped, 2 nodes ×
// 2 real torch ranks under the real torchrun, real sidecars, a file://
// store, the pods' containers run here as processes on played nodes), once
// per repetition, and renders what the test writes to
// SPOTAGENT_K8S_BENCH_OUT: per node, the bytes its restore read from its own
// copy, a peer and the store, and the times from the set's restart to every
// rank's first resumed step; first with every rank back on its node, then
// with rank 1 moved to an empty node. Without the control plane and the
// controllers in the cache (make kcp-controllers) it says it skipped, in the
// report and its targets.

const k8sTest = "TestK8sJobSetRestartReusesCopies"

// k8sCase and k8sNode are deploy's copiesCase and copiesNode as JSON.
type k8sCase struct {
	Test                string    `json:"test"`
	Case                string    `json:"case"`
	RestartToCreatedS   float64   `json:"restart_to_created_s"`
	CreatedToFirstStepS float64   `json:"created_to_first_step_s"`
	RestartToFirstStepS float64   `json:"restart_to_first_step_s"`
	Nodes               []k8sNode `json:"nodes"`
}

type k8sNode struct {
	Rank                int     `json:"rank"`
	Node                string  `json:"node"`
	From                string  `json:"from"`
	Step                int64   `json:"step"`
	Bytes               int64   `json:"bytes"`
	LocalBytes          int64   `json:"local_bytes"`
	PeerBytes           int64   `json:"peer_bytes"`
	StoreBytes          int64   `json:"store_bytes"`
	CreatedToRestoredS  float64 `json:"created_to_restored_s"`
	CreatedToFirstStepS float64 `json:"created_to_first_step_s"`
}

var k8sCases = []string{"same nodes", "rank 1 moved"}

func benchK8s(c *config, r *report.Report) error {
	title := "Kubernetes: a JobSet's whole-set restart with copies that outlive the pods"
	if err := exec.Command("scripts/controllers-build.sh", "--cached").Run(); err != nil {
		msg := "skipped: control plane not cached (make kcp-controllers builds the control plane and the JobSet, Trainer and Kueue controllers into ~/.cache/spotagent-kcp)"
		fmt.Fprintf(os.Stderr, "\n   !!! k8s section %s\n\n", msg)
		r.Add(title, "**"+msg+".** Nothing was measured.\n")
		r.Target(report.Target{Name: "whole-set restart of a 2 × 2 JobSet (real JobSet controller): bytes from the store on the nodes that survived",
			Want: "0", Got: msg, Met: false, Margin: "not measured"})
		return nil
	}
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	work := filepath.Join(c.work, "k8s")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	out := filepath.Join(work, "cases.jsonl")
	os.Remove(out)
	load0 := loadavgNow()
	began := time.Now()
	for rep := range c.k8sReps {
		logPath := filepath.Join(work, fmt.Sprintf("test-%d.log", rep+1))
		log, err := os.Create(logPath)
		if err != nil {
			return err
		}
		cmd := exec.Command(goBin, "test", "-tags", "disable_grpc_modules,grpcnotrace", "-run", "^"+k8sTest+"$",
			"-count=1", "-v", "-timeout", "30m", "./deploy")
		cmd.Env = append(os.Environ(), "SPOTAGENT_K8S_CONTROLLERS=1", "SPOTAGENT_K8S_BENCH_OUT="+out)
		cmd.Stdout, cmd.Stderr = log, log
		t0 := time.Now()
		err = cmd.Run()
		log.Close()
		if err != nil {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s run %d: %w\n%s", k8sTest, rep+1, err, tailString(string(b), 4000))
		}
		logf("%s run %d of %d: %s", k8sTest, rep+1, c.k8sReps, time.Since(t0).Round(time.Second))
	}
	took := time.Since(began)
	cases, err := readK8sCases(out)
	if err != nil {
		return err
	}
	for _, name := range k8sCases {
		if n := len(cases[name]); n != c.k8sReps {
			return fmt.Errorf("%s: %d %q records in %s, want %d (one a run)", k8sTest, n, name, out, c.k8sReps)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "`deploy/kubernetes/multinode-jobset.yaml` as shipped (`copies.where: hostPath`, `--peer-restore`, replicas 0) on the real control plane (kube-apiserver, kube-controller-manager v1.35.4) and the real JobSet controller (v0.11.1), run by `%s` (deploy/k8s_copies_test.go): 2 nodes × 2 ranks, each pod's containers run on this machine as processes (the real sidecar, the real torchrun on python/examples/train_ddp.py: a small DDP model, gloo on the CPU), each played node a directory that holds the hostPath and outlives the pods; a file:// store. The test plays the scheduler and the kubelet. Each run: the job trains and commits; rank 1's pod is evicted (a drain: `DisruptionTarget`, the kubelet's SIGTERM; the job takes its shutdown checkpoint and rank 1's trainer exits 75); the JobSet controller restarts the set (`BlockingRecreate`: deletes rank 0's pod, then recreates both; not counted against `maxRestarts`). *same nodes*: both new pods land on their old nodes. *rank 1 moved*: the same drain again, rank 1's new pod lands on an empty node. Bytes: each sidecar's own counts in its \"restored checkpoint\" line. Times from the test seeing the controller delete rank 0's pod (*restart*) or the new pods (*created*); *restored*: the sidecar's log time of its restore; *first step*: the slower of the node's two ranks printing its first step after the checkpoint's (their logs polled every 100 ms). %d runs (one `go test` each, a fresh control plane each), medians (min–max), seconds; %s in all.\n\n",
		k8sTest, c.k8sReps, took.Round(time.Second))
	b.WriteString("| case | rank (node) | restored from | bytes: own copy | peer | store | created → restored | created → first step |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, name := range k8sCases {
		for k := range 2 {
			node := func(f func(k8sNode) float64) []float64 {
				var xs []float64
				for _, x := range cases[name] {
					xs = append(xs, f(x.Nodes[k]))
				}
				return xs
			}
			where := "its node"
			if name == "rank 1 moved" && k == 1 {
				where = "an empty node"
			}
			from := map[string]bool{}
			for _, x := range cases[name] {
				from[x.Nodes[k].From] = true
			}
			fmt.Fprintf(&b, "| %s | %d (%s) | %s | %s | %s | %s | %s | %s |\n", name, k, where, strings.Join(sortedKeys(from), ", "),
				bytesCol(node(func(n k8sNode) float64 { return float64(n.LocalBytes) })),
				bytesCol(node(func(n k8sNode) float64 { return float64(n.PeerBytes) })),
				bytesCol(node(func(n k8sNode) float64 { return float64(n.StoreBytes) })),
				medRange(node(func(n k8sNode) float64 { return n.CreatedToRestoredS })),
				medRange(node(func(n k8sNode) float64 { return n.CreatedToFirstStepS })))
		}
	}
	b.WriteString("\n| case | restart → pods created | created → every rank's first resumed step | restart → every rank's first resumed step |\n| --- | --- | --- | --- |\n")
	for _, name := range k8sCases {
		col := func(f func(k8sCase) float64) string {
			var xs []float64
			for _, x := range cases[name] {
				xs = append(xs, f(x))
			}
			return medRange(xs)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, col(func(x k8sCase) float64 { return x.RestartToCreatedS }),
			col(func(x k8sCase) float64 { return x.CreatedToFirstStepS }), col(func(x k8sCase) float64 { return x.RestartToFirstStepS }))
	}
	fmt.Fprintf(&b, "\n*restart → pods created* is the JobSet controller's and the Job controller's work plus the played kubelet ending rank 0's pod (SIGTERM to what still runs of it, the sidecar last) and reporting it gone: `BlockingRecreate` creates no pod before every old one is gone. The checkpoint is tiny (a few tens of KB a node): the times are the restart's fixed cost (the sidecar's start and restore, torchrun's start and rendezvous, `import torch`, the process group), not transfer time; the bytes are what the copies save. Everything (etcd, kube-apiserver, kube-controller-manager, the JobSet controller, 4 torch ranks, 2 torchruns, 2 sidecars, the test) shares this machine's %d cores with whatever else runs: load average %s before the section, %s after.\n",
		runtime.NumCPU(), load0, loadavgNow())

	var survivors, moved, part []float64
	for _, name := range k8sCases {
		for _, x := range cases[name] {
			for _, n := range x.Nodes {
				if name == "rank 1 moved" && n.Rank == 1 {
					moved = append(moved, float64(n.StoreBytes))
					part = append(part, float64(n.Bytes))
				} else {
					survivors = append(survivors, float64(n.StoreBytes))
				}
			}
		}
	}
	_, worst := stats.MinMax(survivors)
	_, movedMax := stats.MinMax(moved)
	partMin, _ := stats.MinMax(part)
	r.Add(title, b.String())
	r.Target(report.Target{Name: "whole-set restart of a 2 × 2 JobSet (real JobSet controller, hostPath copies): bytes from the store on the nodes that survived",
		Want: "0", Got: fmt.Sprintf("%.0f B (worst of %d restores)", worst, len(survivors)), Met: worst == 0, Margin: fmt.Sprintf("%.0f B over", worst)})
	r.Target(report.Target{Name: "the same restart, rank 1 moved to an empty node: its bytes from the store",
		Want: "≤ its own part", Got: fmt.Sprintf("%.0f B (its part %.0f B)", movedMax, partMin), Met: movedMax <= partMin,
		Margin: fmt.Sprintf("%.0f B", partMin-movedMax)})
	r.Command(fmt.Sprintf("SPOTAGENT_K8S_CONTROLLERS=1 SPOTAGENT_K8S_BENCH_OUT=FILE go test -tags disable_grpc_modules,grpcnotrace -run '^%s$' -count=1 -v -timeout 30m ./deploy (× %d)", k8sTest, c.k8sReps))
	return nil
}

// readK8sCases reads the test's JSON lines by case name.
func readK8sCases(path string) (map[string][]k8sCase, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s wrote no measurements: %w", k8sTest, err)
	}
	defer f.Close()
	out := map[string][]k8sCase{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c k8sCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("%s: %w: %s", path, err, sc.Text())
		}
		if len(c.Nodes) != 2 {
			return nil, fmt.Errorf("%s: case %q has %d nodes, want 2", path, c.Case, len(c.Nodes))
		}
		out[c.Case] = append(out[c.Case], c)
	}
	return out, sc.Err()
}

// bytesCol is a byte count's median, with its range when the runs differ.
func bytesCol(xs []float64) string {
	lo, hi := stats.MinMax(xs)
	if lo == hi {
		return fmt.Sprintf("%.0f B", lo)
	}
	return fmt.Sprintf("%.0f B (%.0f–%.0f)", stats.Median(xs), lo, hi)
}

func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

func loadavgNow() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return string(bytes.Join(bytes.Fields(b)[:3], []byte(" ")))
}
