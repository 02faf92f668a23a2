package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// Issue 24, "What must be true": the orders in which Kubernetes (and
// shells, init systems, spot replacements) stop the pieces of a 2-node ×
// 2-rank job, each under the real torchrun (python/examples/torchrun.py)
// and the real agent binary, each resuming bit-identically where a
// checkpoint is due.

// waitFile waits until path exists (a sidecar's socket).
func waitFile(t *testing.T, path string, timeout time.Duration) {
	t.Helper()
	testutil.WaitWithin(t, path+" to appear", timeout, func() bool { _, err := os.Stat(path); return err == nil })
}

// sidecarJob is a job of ddpNodes pods: in each, a sidecar agent
// (--node-rank K) and a trainer container running torchrun, which finds
// the sidecar through SPOTAGENT_SOCKET.
type sidecarJob struct {
	sidecars []*proc
	trainers []*proc
	exitFile []string // SPOTAGENT_EXIT_FILE of each node's trainer
}

func startSidecarJob(t *testing.T, env []string, uri, dir string, agentArgs, trainerEnv []string) *sidecarJob {
	t.Helper()
	port := freePort(t)
	j := &sidecarJob{}
	for k := 0; k < ddpNodes; k++ {
		sock := filepath.Join(dir, fmt.Sprintf("n%d.sock", k))
		args := append([]string{"sidecar", "--store", uri, "--run-id", "it",
			"--checkpoint-dir", filepath.Join(dir, fmt.Sprintf("n%d", k)), "--socket", sock,
			"--cloud", "none", "--log-format", "json", "--node-rank", strconv.Itoa(k)}, agentArgs...)
		j.sidecars = append(j.sidecars, start(t, env, args...))
		waitFile(t, sock, time.Minute)
		exitFile := filepath.Join(dir, fmt.Sprintf("n%d.exit", k))
		cmd := exec.Command(python, ddpLauncher(k, port)[1:]...)
		cmd.Dir = repo
		cmd.Env = append(append(cleanEnv(), env...), trainerEnv...)
		cmd.Env = append(cmd.Env, "SPOTAGENT_SOCKET="+sock, "SPOTAGENT_EXIT_FILE="+exitFile)
		j.trainers = append(j.trainers, startCmd(t, cmd))
		j.exitFile = append(j.exitFile, exitFile)
	}
	return j
}

// endedBy reports whether p's process ended by sig (its code is then -1).
func endedBy(p *proc, sig syscall.Signal) bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// finishedJob runs a fresh job from uri to its end (sidecars, trainers
// exiting 0) and returns every rank's final line; from is the step every
// rank must say it resumed from (-1: none).
func finishedJob(t *testing.T, env []string, uri string, from int64) map[int]string {
	t.Helper()
	j := startSidecarJob(t, env, uri, testutil.ShortDir(t), []string{"--interval", "1h"}, ddpEnv(0))
	var outs []string
	for k, tr := range j.trainers {
		if code := tr.wait(3 * time.Minute); code != 0 {
			t.Fatalf("node %d: resumed trainer exited %d", k, code)
		}
		outs = append(outs, tr.output())
	}
	for k, s := range j.sidecars {
		s.signal(syscall.SIGTERM)
		if code := s.wait(time.Minute); code != 0 {
			t.Errorf("node %d: sidecar exit code %d after its trainer finished, want 0", k, code)
		}
	}
	if from >= 0 {
		rx := regexp.MustCompile(`rank (\d+) resuming from step (\d+)`)
		got := map[string]string{}
		for _, out := range outs {
			for _, m := range rx.FindAllStringSubmatch(out, -1) {
				got[m[1]] = m[2]
			}
		}
		for r := 0; r < ddpNodes*ddpRanks; r++ {
			if got[strconv.Itoa(r)] != strconv.FormatInt(from, 10) {
				t.Errorf("rank %d resumed from step %q, want %d (resumed: %v)", r, got[strconv.Itoa(r)], from, got)
			}
		}
	}
	return finals(t, outs...)
}

// savedSteps is every "rank R checkpoint ID (REASON) at step S" line of
// the outputs, by rank.
func savedSteps(outs ...string) map[int][]string {
	rx := regexp.MustCompile(`rank (\d+) checkpoint (\S+) \((\w+)\) at step (\d+)`)
	got := map[int][]string{}
	for _, out := range outs {
		for _, m := range rx.FindAllStringSubmatch(out, -1) {
			r, _ := strconv.Atoi(m[1])
			got[r] = append(got[r], m[2]+" "+m[3]+" "+m[4])
		}
	}
	return got
}

// (b) The native-sidecar order: the kubelet SIGTERMs node 1's trainer
// container (torchrun, which forwards SIGTERM to its ranks at once; the
// ranks run with SPOTAGENT_HANDLE_SIGTERM=1), and its sidecar only once
// the trainer has exited. One job-wide shutdown checkpoint with a part
// from every node; every rank stops; every trainer's exit file says 75;
// a fresh job resumes from it bit-identically.
func TestK8sOrder_TrainerSIGTERMThenSidecar(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	ref := ddpRef(t)
	env, uri, st := s3Store(t, "order-b")
	j := startSidecarJob(t, env, uri, testutil.ShortDir(t), []string{"--interval", "1h"},
		append(ddpEnv(50), "SPOTAGENT_HANDLE_SIGTERM=1"))
	j.trainers[1].waitLine(`rank 2 step 30\b`, 3*time.Minute)
	j.trainers[1].signal(syscall.SIGTERM) // torchrun only, as the kubelet does
	// Node 0's ranks stop too (exit 75), but its torchrun then waits in
	// its exit barrier for node 1's torchrun, which the signal ended: 300 s
	// in torch 1.13 (docs/distributed.md, "What torchrun does"). The
	// Job's restart deletes that pod: SIGTERM it once its ranks are gone.
	for r := 0; r < ddpRanks; r++ {
		j.trainers[0].waitLine(fmt.Sprintf(`rank %d final sha256=`, r), 2*time.Minute)
	}
	j.trainers[0].waitLine(`failed \(exitcode: 75\)`, time.Minute)
	// A SIGTERM that lands while torchrun logs is lost (torch 1.13 raises
	// its SignalException inside log.error, and logging swallows it:
	// "--- Logging error ---"), and torchrun then waits out the barrier,
	// inside the c10d store's C++ wait, where Python runs no signal
	// handler until it returns (300 s). Signal again until it exits, as a
	// kubelet would not; past that, SIGKILL it as the kubelet does at the
	// end of the grace period. Its code is then the kill's, not torchrun's:
	// the ranks' exit files still say 75 (checked below).
	killed0 := false
	for i := 0; ; i++ {
		j.trainers[0].cmd.Process.Signal(syscall.SIGTERM) // it may just have exited
		select {
		case <-j.trainers[0].done:
		case <-time.After(5 * time.Second):
			if i < 5 {
				continue
			}
			t.Log("node 0's torchrun still runs 6 SIGTERMs after its ranks exited (blocked in its exit barrier): SIGKILL, as the kubelet does after the grace period")
			j.trainers[0].cmd.Process.Signal(syscall.SIGKILL)
			killed0 = true
		}
		break
	}
	for k, tr := range j.trainers {
		code := tr.wait(2 * time.Minute)
		if k == 0 && (killed0 || endedBy(tr, syscall.SIGTERM)) {
			// Its code is the kill's, not torchrun's: one of the
			// SIGTERMs above landed once torchrun had put its handler
			// away on its way out (seen once in a loaded make test).
			continue
		}
		// torchrun exits 1 when its workers exit 75 (docs/distributed.md)
		if code != 1 {
			t.Errorf("node %d: torchrun exited %d, want 1 (its workers' 75)", k, code)
		}
	}
	for k := len(j.sidecars) - 1; k >= 0; k-- { // node 1's pod first
		j.sidecars[k].signal(syscall.SIGTERM)
		if code := j.sidecars[k].wait(time.Minute); code != 0 {
			t.Errorf("node %d: sidecar exit code %d, want 0", k, code)
		}
	}
	for k, f := range j.exitFile {
		if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != "75" {
			t.Errorf("node %d: SPOTAGENT_EXIT_FILE holds %q (%v), want 75", k, b, err)
		}
	}
	ms := manifests(t, st)
	if len(ms) != 1 {
		var steps []string
		for _, m := range ms {
			steps = append(steps, fmt.Sprintf("%d(%s)", m.Step, m.Reason))
		}
		t.Fatalf("%d committed checkpoints %v, want one job-wide shutdown checkpoint", len(ms), steps)
	}
	m := ms[0]
	if m.Reason != "shutdown" {
		t.Errorf("checkpoint reason %q, want shutdown", m.Reason)
	}
	jobCheckpoint(t, m)
	saved := savedSteps(j.trainers[0].output(), j.trainers[1].output())
	for r := 0; r < ddpNodes*ddpRanks; r++ {
		if len(saved[r]) != 1 || !strings.HasSuffix(saved[r][0], fmt.Sprintf(" %d", m.Step)) {
			t.Errorf("rank %d saved %v, want one checkpoint at step %d", r, saved[r], m.Step)
		}
	}
	if t.Failed() {
		return
	}
	sameFinals(t, ref, finishedJob(t, env, uri, m.Step))
}

// The exit-code mapping against what torchrun does (docs/distributed.md,
// "What torchrun does"): torchrun exits 1 when its workers exit 75. A
// single-node job of 2 ranks under `spotagent run` (no --node-rank), its
// shutdown checkpoint committed and its ranks stopped (exit 75), must make
// `spotagent run` exit 75, not 1, as it does for a single trainer.
func TestTorchrun_SingleNodeShutdownExits75(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	env, uri, st := s3Store(t, "single")
	dir := testutil.ShortDir(t)
	a := start(t, append(env, ddpEnv(50)...), append([]string{"run", "--store", uri, "--run-id", "it",
		"--checkpoint-dir", filepath.Join(dir, "ck"), "--socket", filepath.Join(dir, "s.sock"),
		"--cloud", "none", "--log-format", "json", "--interval", "1h", "--"},
		torchrunCmd(1, 0, 2, freePort(t), "python/examples/train_ddp.py")...)...)
	a.waitLine(`rank 0 step 30\b`, 3*time.Minute)
	a.signal(syscall.SIGTERM)
	code := a.wait(2 * time.Minute)
	ms := manifests(t, st)
	if len(ms) != 1 || ms[0].Reason != "shutdown" {
		t.Fatalf("want one shutdown checkpoint, got %d", len(ms))
	}
	stopped := regexp.MustCompile(`rank \d stopping at step \d+: shutdown`).FindAllString(a.output(), -1)
	if len(stopped) != 2 {
		t.Fatalf("%d ranks stopped for the shutdown, want 2", len(stopped))
	}
	if code != exitInterrupted {
		t.Fatalf("spotagent run exited %d after a committed shutdown checkpoint and ranks that exited 75 (torchrun's own code: 1), want %d", code, exitInterrupted)
	}
}

// (d) Node mode: one `spotagent node` for the machine, two pods of one
// job on it (node ranks 0 and 1, SPOTAGENT_RUN_ID the job's name): each
// pod's ranks are a part of their own, a notice on the machine makes one
// job checkpoint of both parts, and the pods started again resume from it
// bit-identically through the same node agent.
func TestK8sOrder_NodeModeTwoPodsOfOneJob(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	ref := ddpRef(t)
	dir := testutil.ShortDir(t)
	imds := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds.Close)
	sock := filepath.Join(dir, "agent.sock")
	prefix := "file://" + filepath.Join(dir, "runs")
	agent := start(t, nil, "node", "--store-prefix", prefix, "--checkpoint-root", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--interval", "1h", "--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", "100ms",
		"--log-format", "json")
	agent.waitLine(`socket listening`, time.Minute)
	st := openTestStore(t, prefix+"/it", all.Options{})
	pods := func(sleepMS int) []*proc {
		port := freePort(t)
		var trs []*proc
		for k := 0; k < ddpNodes; k++ {
			cmd := exec.Command(python, ddpLauncher(k, port)[1:]...)
			cmd.Dir = repo
			cmd.Env = append(append(cleanEnv(), ddpEnv(sleepMS)...), "SPOTAGENT_SOCKET="+sock, "SPOTAGENT_RUN_ID=it")
			trs = append(trs, startCmd(t, cmd))
		}
		return trs
	}
	first := pods(50)
	first[1].waitLine(`rank 2 step 30\b`, 3*time.Minute)
	imds.Notice()
	for k, tr := range first {
		if code := tr.wait(3 * time.Minute); code != 1 {
			t.Errorf("pod %d: torchrun exited %d, want 1 (its workers' 75)", k, code)
		}
	}
	ms := manifests(t, st)
	if len(ms) != 1 {
		t.Fatalf("%d committed checkpoints, want one job-wide interruption checkpoint", len(ms))
	}
	jobCheckpoint(t, ms[0])
	if ms[0].Reason != "interruption" {
		t.Errorf("checkpoint reason %q, want interruption", ms[0].Reason)
	}
	saved := savedSteps(first[0].output(), first[1].output())
	for r := 0; r < ddpNodes*ddpRanks; r++ {
		if len(saved[r]) != 1 || !strings.HasSuffix(saved[r][0], fmt.Sprintf(" %d", ms[0].Step)) {
			t.Errorf("rank %d saved %v, want one checkpoint at step %d", r, saved[r], ms[0].Step)
		}
	}
	if t.Failed() {
		return
	}
	second := pods(0)
	var outs []string
	for k, tr := range second {
		if code := tr.wait(3 * time.Minute); code != 0 {
			t.Fatalf("pod %d: resumed torchrun exited %d", k, code)
		}
		tr.waitLine(fmt.Sprintf(`rank \d+ resuming from step %d\b`, ms[0].Step), time.Second)
		outs = append(outs, tr.output())
	}
	sameFinals(t, ref, finals(t, outs...))
	agent.signal(syscall.SIGTERM)
	if code := agent.wait(time.Minute); code != 0 {
		t.Errorf("node agent exit code %d, want 0", code)
	}
}

// The stop deadline under torchrun: ranks that never answer the shutdown
// request are SIGTERMed with their launcher's group at the deadline, as
// a single trainer is; torchrun then exits 1 (its SignalException), never
// 128+15. `spotagent run` must exit 75 as it does for a single trainer
// stopped at the deadline (docs/protocol.md, "Exit codes": the previous
// committed checkpoint stands), not pass the 1 through as a crash.
func TestTorchrun_DeadlineKillExits75(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	dir := testutil.ShortDir(t)
	// Each rank connects, says it is rank RANK of WORLD_SIZE, and never polls.
	deaf := fakeTrainer("--no-poll", "--sync-every", "0")
	a := start(t, nil, append([]string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "it",
		"--checkpoint-dir", filepath.Join(dir, "ck"), "--socket", filepath.Join(dir, "s.sock"),
		"--cloud", "none", "--log-format", "json", "--interval", "1h", "--term-grace", "4s", "--margin", "1s", "--"},
		torchrunCmd(1, 0, 2, freePort(t), deaf[1:]...)...)...)
	a.waitLine(`trainer: connected .*rank=0\b`, 2*time.Minute)
	a.waitLine(`trainer: connected .*rank=1\b`, 2*time.Minute)
	a.signal(syscall.SIGTERM)
	if code := a.wait(2 * time.Minute); code != exitInterrupted {
		t.Fatalf("spotagent run exited %d after stopping a deaf torchrun job at the deadline, want %d", code, exitInterrupted)
	}
}
