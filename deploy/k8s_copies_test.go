package deploy

// Issue 45's whole-job restart: multinode-jobset.yaml as shipped
// (copies.where: hostPath) on the real JobSet, Job and API server, its two
// pods' containers run here as processes (procPod) on two played nodes,
// each node a directory that holds the hostPath volume and outlives the
// pods. The test is the scheduler (rank k on node k, before and after) and
// the kubelet.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// fakeTorchrunNodes is fakeTorchrun for a job of 2 nodes × 2 ranks: the
// real torchrun on python/examples/train_ddp.py with the node rank the
// manifest's script passes (or, under the Kubeflow runtime, the Trainer's
// PET_NODE_RANK), rank 0 on loopback at SPOTAGENT_TEST_MASTER_PORT
// (the set's pods share it).
func fakeTorchrunNodes(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
nr=${PET_NODE_RANK:-}
for a in "$@"; do case "$a" in --node_rank=*) nr=${a#--node_rank=} ;; esac; done
[ -n "$nr" ] || { echo "torchrun: no --node_rank in $* and no PET_NODE_RANK" >&2; exit 2; }
export TOTAL_STEPS=1000000 STEP_SLEEP_MS=40 PYTHONPATH=%[1]s/python
exec /usr/bin/python3 %[1]s/python/examples/torchrun.py --nnodes=2 --nproc_per_node=2 --node_rank="$nr" \
  --master_addr=127.0.0.1 --master_port="$SPOTAGENT_TEST_MASTER_PORT" %[1]s/python/examples/train_ddp.py
`, repo)
	if err := os.WriteFile(filepath.Join(dir, "torchrun"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// restoredEntry is the sidecar's "restored checkpoint" log entry.
type restoredEntry struct {
	TS         string `json:"ts"` // zap's ISO 8601, milliseconds
	Step       int64  `json:"step"`
	Bytes      int64  `json:"bytes"`
	From       string `json:"from"`
	LocalBytes int64  `json:"local_bytes"`
	PeerBytes  int64  `json:"peer_bytes"`
	StoreBytes int64  `json:"store_bytes"`
}

// restored returns the sidecar's restore, waiting for it.
func (pp *procPod) restored(timeout time.Duration) restoredEntry {
	pp.t.Helper()
	var out restoredEntry
	waitFor(pp.t, timeout, pp.pod.Name+"'s sidecar restored", func() (bool, error) {
		b, _ := os.ReadFile(filepath.Join(pp.dir, "spotagent.log"))
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, `"msg":"restored checkpoint"`) {
				continue
			}
			if err := json.Unmarshal([]byte(line), &out); err != nil {
				return false, fmt.Errorf("%s: %w", line, err)
			}
			return true, nil
		}
		return false, nil
	})
	return out
}

// TestK8sJobSetRestartReusesCopies: a 2-node × 2-rank job from
// multinode-jobset.yaml trains on nodes A and B (real sidecars, real
// torchrun, real train_ddp.py ranks, a file:// store) and commits
// checkpoints; node B's pod is evicted (a drain: DisruptionTarget), its
// trainer gets the kubelet's SIGTERM and the job takes its shutdown
// checkpoint; the real JobSet controller recreates every pod
// (BlockingRecreate), uncounted; the new pods land on the same nodes by
// rank, and each node restores from the copy its old pod left in the
// hostPath, reading 0 bytes from the store; every rank resumes from the
// shutdown checkpoint's step. Then node B is lost: after the next drain
// rank 1 lands on an empty node C and reads its own part from the store,
// rank 0 again nothing. Logs the bytes by source and the time from the
// set's recreation to every rank's first resumed step.
func TestK8sJobSetRestartReusesCopies(t *testing.T) {
	needControllers(t)
	t.Parallel()
	cp := runJobSetController(t)
	agent := spotagentBinary(t)
	js, doc := readJobSet(t)
	if v := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Volumes; !hasHostPath(v, "checkpoints") {
		t.Fatalf("%s: the checkpoints volume is not a hostPath (copies.where: hostPath)", jobSetPath)
	}
	ns := cp.namespace(t, "copies")
	cp.applyKinds(t, jobSetPath, ns, "ServiceAccount")
	cp.applySoon(t, doc, ns)
	spec := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec
	restartsReuseCopies(t, cp, ns, js.Metadata.Name, spec, agent, fakeTorchrunNodes(t), true)
}

// restartsReuseCopies plays the JobSet name's 2 pods (of spec) on played
// nodes through a drain whose restart lands every rank on its node again
// (each restores from its hostPath copy, 0 bytes from the store), then,
// with nodeLoss, a drain after which rank 1 lands on an empty node.
func restartsReuseCopies(t *testing.T, cp *controlPlane, ns, name string, spec corev1.PodSpec, agent, fakeBin string, nodeLoss bool) {
	t.Helper()
	store := t.TempDir()
	nodes := []string{"copies-a-" + ns, "copies-b-" + ns, "copies-c-" + ns}
	nodeDirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	for _, n := range nodes {
		cp.node(t, n, map[string]string{"kubernetes.io/hostname": n})
	}
	place := []int{0, 1} // the node of each rank's pod: the test is the scheduler
	rankOf := func(p corev1.Pod) int {
		k, err := strconv.Atoi(completionIndex(p))
		if err != nil || k < 0 || k > 1 {
			t.Fatalf("pod %s: completion index %q", p.Name, completionIndex(p))
		}
		return k
	}
	j := cp.newJobRun(t, ns, name)
	j.jobSelect = "jobset.sigs.k8s.io/jobset-name=" + name
	j.nodeOf = func(p corev1.Pod) string { return nodes[place[rankOf(p)]] }

	grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	trainer := spec.Containers[0].Name
	var all []*procPod
	defer func() { // before t.TempDir's cleanups remove the logs
		if t.Failed() {
			for _, pp := range all {
				t.Logf("--- %s (%s): trainer:\n%s\n--- sidecar:\n%s", pp.pod.Name, pp.node, pp.log(trainer), pp.log("spotagent"))
			}
		}
	}()
	// runSet waits for the set's two new pods and starts them on their
	// ranks' nodes, rank 0 first in the result.
	runSet := func(timeout time.Duration) ([]corev1.Pod, []*procPod, time.Time) {
		fresh, at := j.newPods(2, timeout)
		if rankOf(fresh[0]) > rankOf(fresh[1]) {
			fresh[0], fresh[1] = fresh[1], fresh[0]
		}
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		var pps []*procPod
		for k, p := range fresh {
			pps = append(pps, startNodePod(t, p, agent, store, fakeBin, nodeDirs[place[k]], ports[0]))
		}
		all = append(all, pps...)
		return j.start(fresh...), pps, at
	}
	// drain evicts rank 1's pod (DisruptionTarget; the kubelet's SIGTERM,
	// trainer first: the job's shutdown checkpoint), then plays the
	// kubelet for rank 0's pod, which the JobSet controller deletes to
	// restart the set. It returns the checkpoint's step.
	drain := func(pods []corev1.Pod, pps []*procPod) (int, time.Time) {
		j.evict(pods[1])
		codes := pps[1].terminate(grace)
		stopped := stoppedRE.FindAllStringSubmatch(pps[0].log(trainer), -1)
		if codes[trainer] != 75 || len(stopped) == 0 {
			t.Fatalf("rank 1's trainer exited %d after SIGTERM, want 75 after a checkpoint", codes[trainer])
		}
		saved, _ := strconv.Atoi(stopped[len(stopped)-1][1])
		var evicted corev1.Pod
		if err := cp.do(http.MethodGet, resourcePath("v1", "Pod", ns, pods[1].Name), "", nil, &evicted); err != nil {
			t.Fatal(err)
		}
		j.exit(evicted, codes)
		j.forget(evicted)
		waitFor(t, 2*time.Minute, "rank 0's pod deleted by the set's restart", func() (bool, error) {
			var p corev1.Pod
			err := cp.do(http.MethodGet, resourcePath("v1", "Pod", ns, pods[0].Name), "", nil, &p)
			return err == nil && p.DeletionTimestamp != nil, err
		})
		restart := time.Now() // the set's restart seen: the controller deleted the survivor's pod
		codes = pps[0].terminate(grace)
		if codes[trainer] != 75 {
			t.Errorf("rank 0's trainer exited %d, want 75 (the job's interruption stop)", codes[trainer])
		}
		j.exit(pods[0], codes)
		j.forget(pods[0])
		return saved, restart
	}
	// resumed checks each node's restore (want(k) says where node k's bytes
	// may come from) and waits for every rank's first step after it.
	resumed := func(c copiesCase, pps []*procPod, saved int, restart, at time.Time, want func(k int, r restoredEntry) string) {
		c.RestartToCreatedS = at.Sub(restart).Seconds()
		for k, pp := range pps {
			r := pp.restored(podStart)
			t.Logf("rank %d's pod on %s: restored step %d, %d bytes: local %d, peer %d, store %d (%s)",
				k, nodes[place[k]], r.Step, r.Bytes, r.LocalBytes, r.PeerBytes, r.StoreBytes, r.From)
			if r.Step != int64(saved) || r.Bytes == 0 {
				t.Errorf("rank %d's pod restored step %d (%d bytes), want %d (the shutdown checkpoint)", k, r.Step, r.Bytes, saved)
			}
			if msg := want(k, r); msg != "" {
				t.Errorf("rank %d's pod on %s: %s", k, nodes[place[k]], msg)
			}
			ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", r.TS)
			if err != nil {
				t.Errorf("rank %d's pod: the restore's log time %q: %v", k, r.TS, err)
			}
			c.Nodes = append(c.Nodes, copiesNode{Rank: k, Node: nodes[place[k]], From: r.From, Step: r.Step, Bytes: r.Bytes,
				LocalBytes: r.LocalBytes, PeerBytes: r.PeerBytes, StoreBytes: r.StoreBytes, CreatedToRestoredS: ts.Sub(at).Seconds()})
		}
		for k, pp := range pps {
			for _, rank := range []int{2 * k, 2*k + 1} {
				re := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d resuming from step (\d+)$`, rank))
				if m := pp.trainerSays(re, podStart); m[1] != strconv.Itoa(saved) {
					t.Errorf("rank %d resumed from step %s, want %d", rank, m[1], saved)
				}
			}
		}
		// Every rank's first resumed step, each seen on its own (the log
		// polled every 100 ms): a node's time is its slower rank's.
		seen := firstLines(t, pps, func(k, i int) *regexp.Regexp {
			return regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d step %d$`, 2*k+i, saved+1))
		})
		for k := range pps {
			c.Nodes[k].CreatedToFirstStepS = max(seen[k][0].Sub(at), seen[k][1].Sub(at)).Seconds()
			c.CreatedToFirstStepS = max(c.CreatedToFirstStepS, c.Nodes[k].CreatedToFirstStepS)
		}
		c.RestartToFirstStepS = c.RestartToCreatedS + c.CreatedToFirstStepS
		t.Logf("%s: the set's restart → pods recreated %.1fs → every rank's first resumed step %.1fs (%.1fs in all)",
			c.Case, c.RestartToCreatedS, c.CreatedToFirstStepS, c.RestartToFirstStepS)
		writeCopiesCase(t, c)
	}
	fromCopy := func(_ int, r restoredEntry) string {
		if r.From != "local" || r.StoreBytes != 0 {
			return fmt.Sprintf("restored from %q with %d bytes from the store, want all from its hostPath copy and 0 from the store", r.From, r.StoreBytes)
		}
		return ""
	}

	pods, pps, _ := runSet(60 * time.Second)
	pps[0].trainerSays(stepRE, podStart)

	// 1. Both nodes survive: the set comes back on them, rank by rank.
	saved, restart := drain(pods, pps)
	pods, pps, at := runSet(2 * time.Minute)
	resumed(copiesCase{Test: t.Name(), Case: "same nodes"}, pps, saved, restart, at, fromCopy)
	// The copies are where the docs say: <hostPath>/<namespace>/<run name>/node-<rank>.
	for _, v := range spec.Volumes {
		if v.Name != "checkpoints" || v.HostPath == nil {
			continue
		}
		for k := range pps {
			dir := filepath.Join(nodeDirs[place[k]], v.HostPath.Path, ns, name, fmt.Sprintf("node-%d", k))
			if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
				t.Errorf("rank %d's copies: %s empty or missing (%v)", k, dir, err)
			}
		}
	}

	if !nodeLoss {
		if restarts, counted := jobSetRestarts(t, cp, ns, name); restarts != 1 || counted != 0 {
			t.Errorf("JobSet restarts %d, counted %d; want 1, 0 (a drain is not a crash)", restarts, counted)
		}
		for k, pp := range pps {
			j.exit(pods[k], pp.terminate(grace))
		}
		return
	}

	// 2. Rank 1's node is lost: its new pod lands on an empty node C.
	// Rank 0 still reads nothing from the store; rank 1 reads its own part
	// (the manifest's replicas: 0: no other node keeps a copy of it; with
	// peerRestore.replicas 1 it would come from node A).
	saved, restart = drain(pods, pps)
	place = []int{0, 2}
	pods, pps, at = runSet(2 * time.Minute)
	resumed(copiesCase{Test: t.Name(), Case: "rank 1 moved"}, pps, saved, restart, at, func(k int, r restoredEntry) string {
		if k == 0 {
			return fromCopy(k, r)
		}
		if r.LocalBytes != 0 || r.StoreBytes > r.Bytes {
			return fmt.Sprintf("on an empty node: %d local bytes, %d from the store of %d", r.LocalBytes, r.StoreBytes, r.Bytes)
		}
		return ""
	})

	if restarts, counted := jobSetRestarts(t, cp, ns, name); restarts != 2 || counted != 0 {
		t.Errorf("JobSet restarts %d, counted %d; want 2, 0 (drains are not crashes)", restarts, counted)
	}
	for k, pp := range pps {
		j.exit(pods[k], pp.terminate(grace))
	}
}

func hasHostPath(vs []corev1.Volume, name string) bool {
	for _, v := range vs {
		if v.Name == name {
			return v.HostPath != nil
		}
	}
	return false
}

// copiesCase is one whole-set restart of restartsReuseCopies as
// SPOTAGENT_K8S_BENCH_OUT receives it (`make bench`'s k8s section,
// bench/cmd/spotbench/k8s.go, renders it). Times in seconds: restart is
// the test seeing the JobSet controller delete the surviving rank's pod
// (after the drained pod failed), created the test seeing the new pods.
type copiesCase struct {
	Test                string       `json:"test"`
	Case                string       `json:"case"` // "same nodes", "rank 1 moved"
	RestartToCreatedS   float64      `json:"restart_to_created_s"`
	CreatedToFirstStepS float64      `json:"created_to_first_step_s"` // every rank's
	RestartToFirstStepS float64      `json:"restart_to_first_step_s"`
	Nodes               []copiesNode `json:"nodes"`
}

// copiesNode is one node's restore in a copiesCase: the sidecar's own
// byte counts, by source.
type copiesNode struct {
	Rank                int     `json:"rank"`
	Node                string  `json:"node"`
	From                string  `json:"from"`
	Step                int64   `json:"step"`
	Bytes               int64   `json:"bytes"`
	LocalBytes          int64   `json:"local_bytes"`
	PeerBytes           int64   `json:"peer_bytes"`
	StoreBytes          int64   `json:"store_bytes"`
	CreatedToRestoredS  float64 `json:"created_to_restored_s"`   // the sidecar's "restored checkpoint"
	CreatedToFirstStepS float64 `json:"created_to_first_step_s"` // the node's slower rank
}

// writeCopiesCase appends c as one JSON line to $SPOTAGENT_K8S_BENCH_OUT
// when it is set (nothing otherwise).
func writeCopiesCase(t *testing.T, c copiesCase) {
	t.Helper()
	path := os.Getenv("SPOTAGENT_K8S_BENCH_OUT")
	if path == "" || t.Failed() {
		return
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("SPOTAGENT_K8S_BENCH_OUT: %v", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		t.Fatalf("SPOTAGENT_K8S_BENCH_OUT: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("SPOTAGENT_K8S_BENCH_OUT: %v", err)
	}
}

// firstLines polls every pod's trainer log (2 ranks a pod) until each
// rank has printed its line re(k, i) (pod k, its rank i), and returns when
// each line was first seen.
func firstLines(t *testing.T, pps []*procPod, re func(k, i int) *regexp.Regexp) [][2]time.Time {
	t.Helper()
	seen := make([][2]time.Time, len(pps))
	waitFor(t, podStart, "every rank's first resumed step", func() (bool, error) {
		all := true
		for k, pp := range pps {
			b, _ := os.ReadFile(filepath.Join(pp.dir, pp.pod.Spec.Containers[0].Name+".log"))
			for i := range 2 {
				if seen[k][i].IsZero() && re(k, i).Match(b) {
					seen[k][i] = time.Now()
				}
				all = all && !seen[k][i].IsZero()
			}
		}
		return all, nil
	})
	return seen
}
