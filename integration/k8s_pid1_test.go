package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Issue #37 items 2 and 3: the trainer container of the shipped multi-node
// manifests (deploy/kubernetes/multinode-job.yaml; multinode-jobset.yaml
// runs the same script, deploy/k8s_jobset_test.go) run as a container runs
// it: the manifest's own command, PID 1 of a PID namespace of its own
// (unshare --pid --fork --mount-proc), the kubelet's SIGTERM sent to that
// PID 1. The test plays the kubelet only where Kubernetes substitutes
// (the completion index, rank 0's address, the GPU count, torchrun and
// train.py found in the image).

// manifestTrainer is the trainer container of the Job in path.
func manifestTrainer(t *testing.T, path string) corev1.Container {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec corev1.PodSpec `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if obj.Kind != "Job" {
			continue
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			if c.Name == "trainer" {
				return c
			}
		}
	}
	t.Fatalf("%s: no Job with a trainer container", path)
	return corev1.Container{}
}

// pid1Trainer is node k's trainer container: the manifest's command as PID
// 1 of a new PID namespace, with the manifest's environment.
type pid1Trainer struct {
	p        *proc
	exitFile string
}

// init is the host pid of the namespace's PID 1 (unshare's child).
func (tr *pid1Trainer) init(t *testing.T) int {
	t.Helper()
	var pid int
	testutil.WaitWithin(t, "the container's PID 1", 5*time.Minute, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", tr.p.cmd.Process.Pid, tr.p.cmd.Process.Pid))
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		return pid > 0
	})
	return pid
}

func startPID1Trainer(t *testing.T, c corev1.Container, k, port int, sock, dir string, env []string) *pid1Trainer {
	t.Helper()
	if len(c.Command) != 3 || c.Command[0] != "sh" || c.Command[1] != "-c" {
		t.Fatalf("trainer command %q: want sh -c SCRIPT", c.Command)
	}
	script := c.Command[2]
	for old, new := range map[string]string{
		"$(JOB_COMPLETION_INDEX)":     strconv.Itoa(k), // the kubelet's $(VAR) expansion
		"--nproc_per_node=8":          "--nproc_per_node=" + strconv.Itoa(ddpRanks),
		"--master_addr=exp42-0.exp42": "--master_addr=127.0.0.1",
		"--master_port=29500":         "--master_port=" + strconv.Itoa(port),
	} {
		if !strings.Contains(script, old) {
			t.Fatalf("the manifest's trainer script has no %q:\n%s", old, script)
		}
		script = strings.ReplaceAll(script, old, new)
	}
	// The image: torchrun on PATH (Debian's needs python/examples/torchrun.py)
	// and train.py in the working directory.
	img := filepath.Join(dir, fmt.Sprintf("img%d", k))
	os.MkdirAll(img, 0o755)
	writeExec(t, filepath.Join(img, "torchrun"), "#!/bin/sh\nexec "+python+" "+filepath.Join(repo, "python/examples/torchrun.py")+` "$@"`+"\n")
	writeExec(t, filepath.Join(img, "train.py"), "import runpy, sys\nsys.argv = sys.argv[:1]\nrunpy.run_path("+
		strconv.Quote(filepath.Join(repo, "python/examples/train_ddp.py"))+", run_name='__main__')\n")
	exitFile := filepath.Join(dir, fmt.Sprintf("n%d.exit", k)) // each container's own /tmp
	vars := append(cleanEnv(), "PATH="+img+":"+os.Getenv("PATH"), "PYTHONPATH="+filepath.Join(repo, "python"))
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil:
		case e.Name == "SPOTAGENT_EXIT_FILE":
			vars = append(vars, e.Name+"="+exitFile)
		case e.Name == "SPOTAGENT_SOCKET":
			vars = append(vars, e.Name+"="+sock)
		default:
			vars = append(vars, e.Name+"="+e.Value)
		}
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script)
	cmd.Dir = img
	cmd.Env = append(vars, env...)
	return &pid1Trainer{p: startCmd(t, cmd), exitFile: exitFile}
}

// startPID1Job starts a job of ddpNodes pods: in each, a sidecar agent and
// the manifest's trainer container c as PID 1 of a PID namespace.
func startPID1Job(t *testing.T, c corev1.Container, name string, agentArgs ...string) ([]*proc, []*pid1Trainer, cloud.Store) {
	t.Helper()
	env, uri, st := s3Store(t, name)
	dir := testutil.ShortDir(t)
	port := freePort(t)
	var sidecars []*proc
	var trainers []*pid1Trainer
	for k := 0; k < ddpNodes; k++ {
		sock := filepath.Join(dir, fmt.Sprintf("s%d", k), "agent.sock") // the pod's agent-socket volume
		if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
			t.Fatal(err)
		}
		sidecars = append(sidecars, start(t, env, append([]string{"sidecar", "--store", uri, "--run-id", "it",
			"--checkpoint-dir", filepath.Join(dir, fmt.Sprintf("n%d", k)), "--socket", sock,
			"--cloud", "none", "--log-format", "json", "--node-rank", strconv.Itoa(k),
			"--interval", "1h", "--term-grace", "50s", "--kill-after", "5s"}, agentArgs...)...))
		waitFile(t, sock, time.Minute)
		trainers = append(trainers, startPID1Trainer(t, c, k, port, sock, dir, ddpEnv(50)))
	}
	return sidecars, trainers, st
}

func writeExec(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestK8sPID1_ManifestTrainerExits75 drains node 1 (its pod deleted) in
// the two orders a kubelet uses: the native-sidecar order of Kubernetes
// >= 1.29 (the trainer container's PID 1 gets SIGTERM, the sidecar once
// the trainer has exited) and everything at once. In both, the job's
// shutdown checkpoint commits with both parts, and both trainer
// containers exit 75 within the manifest's grace period: node 1's on the
// forwarded SIGTERM, node 0's, which nobody signals, once its ranks
// stopped, without waiting out torchrun's 300 s exit barrier, and never
// 137.
func TestK8sPID1_ManifestTrainerExits75(t *testing.T) {
	parallelTorchBounded(t)
	requirePython(t, true)
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace (unshare --pid) needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("running as root, but util-linux's unshare is missing: %v", err)
	}
	c := manifestTrainer(t, "deploy/kubernetes/multinode-job.yaml")
	const grace = 110 * time.Second // the manifest's terminationGracePeriodSeconds
	for _, order := range []string{"trainer-first", "all-at-once"} {
		t.Run(order, func(t *testing.T) {
			sidecars, trainers, st := startPID1Job(t, c, "pid1-"+order)
			trainers[1].p.waitLine(`rank 2 step 30\b`, 3*time.Minute)
			t0 := time.Now()
			if err := syscall.Kill(trainers[1].init(t), syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if order == "all-at-once" {
				sidecars[1].signal(syscall.SIGTERM)
			}
			for _, k := range []int{1, 0} {
				code := trainers[k].p.wait(grace + 30*time.Second)
				took := time.Since(t0)
				t.Logf("%s: node %d's trainer container exited %d after %s", order, k, code, took.Round(time.Millisecond))
				if code != exitInterrupted {
					t.Errorf("node %d: trainer container exited %d, want %d", k, code, exitInterrupted)
				}
				if took > grace {
					t.Errorf("node %d: trainer container took %s, past the %s grace period (the kubelet would SIGKILL it: 137)", k, took, grace)
				}
			}
			for k, s := range sidecars {
				select {
				case <-s.done: // all at once: node 1's sidecar ended after its stop
				default:
					s.signal(syscall.SIGTERM) // the kubelet, once the trainer exited
				}
				if code := s.wait(time.Minute); code != 0 && code != exitInterrupted {
					t.Errorf("node %d: sidecar exited %d", k, code)
				}
			}
			l := readLatestPointer(t, st)
			m, err := checkpoint.ReadManifest(t.Context(), st, l.Manifest)
			if err != nil {
				t.Fatalf("latest.json names %s: %v", l.Manifest, err)
			}
			if m.Reason != "shutdown" && m.Reason != "interruption" {
				t.Errorf("latest checkpoint's reason %q, want the drain's shutdown checkpoint", m.Reason)
			}
			jobCheckpoint(t, m)
		})
	}
}

// TestK8sPID1_SilentNodeTrainerExits75: node 1's pod stops answering (its
// sidecar and its trainer container's every process SIGSTOPped: no RST).
// Node 0's sidecar finds node 1's silent and creates peer-lost beside its
// socket; node 0's trainer script ends torchrun, whose ranks wait in a
// collective, and exits 75, well before the ranks' 60 s process-group
// timeout.
// stopNodeOne stops node 1's whole process tree and its agent (SIGSTOP: a
// machine that goes silent without a word), waits for node 0's trainer
// container to exit 75, and returns how long that took.
func stopNodeOne(t *testing.T, trainers []*pid1Trainer, agent1 *proc) time.Duration {
	t.Helper()
	stopped := append(child.Tree(trainers[1].p.cmd.Process.Pid), agent1.cmd.Process.Pid)
	t.Cleanup(func() {
		for _, p := range stopped {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})
	t0 := time.Now()
	for _, p := range stopped {
		syscall.Kill(p, syscall.SIGSTOP)
	}
	code := trainers[0].p.wait(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("node 1 stopped: node 0's trainer container exited %d after %s", code, took.Round(time.Millisecond))
	if code != exitInterrupted {
		t.Fatalf("node 0's trainer container exited %d, want %d", code, exitInterrupted)
	}
	return took
}

func TestK8sPID1_SilentNodeTrainerExits75(t *testing.T) {
	parallelTorchBounded(t)
	requirePython(t, true)
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace (unshare --pid) needs root")
	}
	c := manifestTrainer(t, "deploy/kubernetes/multinode-job.yaml")
	sidecars, trainers, _ := startPID1Job(t, c, "pid1-silent")
	trainers[1].p.waitLine(`rank 2 step 30\b`, 3*time.Minute)
	for _, s := range sidecars {
		s.waitEntry("liveness: a neighbour heard", time.Second, nil)
	}
	took := stopNodeOne(t, trainers, sidecars[1])
	sidecars[0].waitEntry("a neighbour node's agent is silent (its machine stopped answering): told the trainer container to end its ranks",
		time.Second, func(e logEntry) bool { return e.num("peer_node") == 1 })
	if took > 50*time.Second {
		t.Errorf("node 0's trainer container took %s, want well under the ranks' 60 s process-group timeout", took)
	}
}
