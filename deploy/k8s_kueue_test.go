package deploy

// Kueue on the real control plane (k8s_trainer_test.go builds and starts
// the controllers): kubernetes/multinode-jobset.yaml, labelled for the
// queue of kueue/queues.yaml, is admitted, preempted by a higher-priority
// workload and readmitted by the real Kueue controller manager, driving the
// real JobSet and Job controllers. Its pod's containers run here as
// processes (procPod): the real spotagent sidecar with its manifest's
// flags, and the manifest's trainer script with a `torchrun` on PATH that
// runs the real torchrun on python/examples/train_ddp.py (2 ranks), each with the pod's volumes as
// directories. The test is the kubelet: it reports their states, and when
// the Job controller deletes the pod (Kueue suspended the JobSet) it sends
// SIGTERM to the trainer container and then to the sidecar, as a kubelet
// does.

import (
	"bytes"
	"cmp"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const kueueQueuesPath = "kueue/queues.yaml"

// kueueNamespaceLabel marks the namespaces Kueue's webhooks see.
const kueueNamespaceLabel = "spotagent.test/kueue"

// runKueueController starts the JobSet controller and Kueue's controller
// manager once, with Kueue's CRDs and webhooks.
func runKueueController(t *testing.T) *controlPlane {
	t.Helper()
	cp := runJobSetController(t)
	dir := controllersDir(t)
	controllers.kueue.Do(func() {
		cp.installCRDs(t, filepath.Join(dir, "crds", "kueue"))
		controllers.kueueErr = cp.startKueueController(t, dir)
	})
	if controllers.kueueErr != nil {
		t.Fatal(controllers.kueueErr)
	}
	return cp
}

// startKueueController: internalCertManagement off (it would write a
// Secret and patch webhook configurations named for its own Deployment);
// the webhook server on 127.0.0.1 with certDir; metrics and the visibility
// API server (an aggregated apiserver on :8082) off; the JobSet
// integration only. Only the webhooks of Kueue's own kinds and of JobSets
// are registered (a webhook of a disabled integration has no handler),
// for namespaces labelled kueueNamespaceLabel. Without internal cert
// management Kueue reads a metrics certificate from where its cert-manager
// deployment mounts one, even with metrics off: the build's one-line patch
// (scripts/controllers-build.sh) lets KUEUE_METRICS_CERT_DIR name it.
func (cp *controlPlane) startKueueController(t *testing.T, dir string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	certDir := filepath.Join(cp.dir, "kueue-certs")
	if err := cp.servingCerts(certDir); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
webhook: {host: 127.0.0.1, port: %d, certDir: %s}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:%d"}
internalCertManagement: {enable: false}
leaderElection: {leaderElect: false}
integrations:
  frameworks: ["jobset.x-k8s.io/jobset"]
`, ports[0], certDir, ports[1])
	cfgPath := filepath.Join(cp.dir, "kueue-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := cp.startEnv("kueue", filepath.Join(dir, "bin", "kueue"),
		[]string{"KUBECONFIG=" + filepath.Join(cp.dir, "kubeconfig"), "KUEUE_METRICS_CERT_DIR=" + certDir},
		"--config="+cfgPath, "--feature-gates=VisibilityOnDemand=false"); err != nil {
		return err
	}
	if err := cp.waitHTTP("kueue", http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), 120*time.Second); err != nil {
		return err
	}
	cp.registerWebhooks(t, filepath.Join(dir, "webhooks", "kueue.yaml"), "spotagent-test-kueue", ports[0], func(p string) bool {
		return strings.Contains(p, "-jobset-x-k8s-io-") || strings.Contains(p, "-kueue-x-k8s-io-")
	}, kueueNamespaceLabel)
	return nil
}

// ---------------------------------------------------------------- procPod

// procPod runs one pod's containers as processes on this machine.
type procPod struct {
	t       *testing.T
	pod     corev1.Pod
	dir     string // the pod's volumes and logs
	node    string // the played node's root directory, or ""
	sidecar *exec.Cmd
	trainer *exec.Cmd
	done    map[*exec.Cmd]chan struct{}
	codes   map[*exec.Cmd]int32
	mu      sync.Mutex
}

// podEnv resolves a container's environment as the kubelet does: fieldRefs
// of the pod's metadata, then $(VAR) references to earlier variables.
func podEnv(p corev1.Pod, c corev1.Container) ([]string, error) {
	vals := map[string]string{}
	var out []string
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil {
			if f.FieldRef == nil {
				return nil, fmt.Errorf("env %s: only fieldRef is played here", e.Name)
			}
			fp := f.FieldRef.FieldPath
			switch {
			case fp == "metadata.name":
				v = p.Name
			case fp == "metadata.namespace":
				v = p.Namespace
			case strings.HasPrefix(fp, "metadata.annotations['"):
				v = p.Annotations[strings.TrimSuffix(strings.TrimPrefix(fp, "metadata.annotations['"), "']")]
			case strings.HasPrefix(fp, "metadata.labels['"):
				v = p.Labels[strings.TrimSuffix(strings.TrimPrefix(fp, "metadata.labels['"), "']")]
			default:
				return nil, fmt.Errorf("env %s: fieldRef %s is not played here", e.Name, fp)
			}
		} else {
			v = ref.ReplaceAllStringFunc(v, func(m string) string {
				if r, ok := vals[m[2:len(m)-1]]; ok {
					return r
				}
				return m
			})
		}
		vals[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out, nil
}

// kubeExpand replaces $(VAR) in a command or argument, as the kubelet does.
func kubeExpand(s string, env []string) string {
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		s = strings.ReplaceAll(s, "$("+k+")", v)
	}
	return s
}

// hostPaths maps a container's mount paths to the pod's volume directories
// (longest first), and /tmp to a directory of its own when it mounts none.
// On a played node (pp.node set), a hostPath volume is that path under the
// node's directory, at the mount's subPathExpr expanded with the
// container's environment: it outlives the pod, as on a node.
func (pp *procPod) hostPaths(c corev1.Container, env []string) [][2]string {
	var m [][2]string
	tmp := false
	for _, vm := range c.VolumeMounts {
		dir := filepath.Join(pp.dir, "vol", vm.Name)
		if pp.node != "" {
			for _, v := range pp.pod.Spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil {
					dir = filepath.Join(pp.node, v.HostPath.Path, vm.SubPath, kubeExpand(vm.SubPathExpr, env))
				}
			}
		}
		m = append(m, [2]string{vm.MountPath, dir})
		tmp = tmp || vm.MountPath == "/tmp"
	}
	if !tmp {
		m = append(m, [2]string{"/tmp", filepath.Join(pp.dir, c.Name+"-tmp")})
	}
	sort.Slice(m, func(a, b int) bool { return len(m[a][0]) > len(m[b][0]) })
	for _, e := range m {
		if err := os.MkdirAll(e[1], 0o700); err != nil {
			pp.t.Fatal(err)
		}
	}
	return m
}

// remapMount rewrites a path-bearing value through the mounts: the first mount
// path that starts it (or follows an '=') is replaced.
func remapMount(s string, mounts [][2]string) string {
	for _, m := range mounts {
		for _, pre := range []string{"", "="} {
			if i := strings.Index(s, pre+m[0]); i >= 0 && (pre != "" || i == 0) {
				rest := s[i+len(pre)+len(m[0]):]
				if rest == "" || rest[0] == '/' {
					return s[:i+len(pre)] + m[1] + rest
				}
			}
		}
	}
	return s
}

// fileStore turns an s3:// or gs:// URI into a file:// one under root
// (bucket and prefix kept): the tests never reach a cloud.
func fileStore(v, root string) string {
	for _, scheme := range []string{"s3://", "gs://"} {
		if strings.HasPrefix(v, scheme) {
			return "file://" + filepath.Join(root, strings.TrimPrefix(v, scheme))
		}
	}
	return v
}

// startProcPod starts the pod's sidecar (the initContainer spotagent) with
// its manifest's flags but for loopback ports and --cloud none, waits for
// its /readyz (the startupProbe's path: the kubelet starts the trainer
// container after it), then the trainer container's command.
func startProcPod(t *testing.T, p corev1.Pod, agent, store, fakeBin string) *procPod {
	t.Helper()
	return startNodePod(t, p, agent, store, fakeBin, "", 0)
}

// startNodePod is startProcPod on a played node: node is the node's root
// directory (its hostPath volumes live under it; "" for none), masterPort
// the port the fake torchrun's rank 0 listens on, shared by the set's
// pods (0: one of the pod's own).
func startNodePod(t *testing.T, p corev1.Pod, agent, store, fakeBin, node string, masterPort int) *procPod {
	t.Helper()
	pp := &procPod{t: t, pod: p, dir: filepath.Join(t.TempDir(), p.Name), node: node,
		done: map[*exec.Cmd]chan struct{}{}, codes: map[*exec.Cmd]int32{}}
	var side, main *corev1.Container
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == "spotagent" {
			side = &p.Spec.InitContainers[i]
		}
	}
	if side == nil || len(p.Spec.Containers) != 1 {
		t.Fatalf("pod %s: want the spotagent sidecar and one trainer container", p.Name)
	}
	main = &p.Spec.Containers[0]
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", ports[0])

	env, err := podEnv(p, *side)
	if err != nil {
		t.Fatal(err)
	}
	mounts := pp.hostPaths(*side, env)
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		env[i] = k + "=" + remapMount(fileStore(v, store), mounts)
	}
	var args []string
	for _, a := range side.Args {
		a = remapMount(kubeExpand(a, env), mounts)
		switch {
		case strings.HasPrefix(a, "--metrics-addr="):
			a = "--metrics-addr=" + metrics
		case strings.HasPrefix(a, "--peer-listen="):
			a = fmt.Sprintf("--peer-listen=127.0.0.1:%d", ports[1])
		}
		args = append(args, a)
	}
	args = append(args, "--cloud=none")
	pp.sidecar = pp.run("spotagent", agent, args, append(env, "AWS_EC2_METADATA_DISABLED=true"))
	deadline := time.Now().Add(podStart)
	for {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: the sidecar is not ready within %s:\n%s", p.Name, podStart, pp.log("spotagent"))
		}
		select {
		case <-pp.done[pp.sidecar]:
			t.Fatalf("pod %s: the sidecar exited %d:\n%s", p.Name, pp.code(pp.sidecar), pp.log("spotagent"))
		case <-time.After(100 * time.Millisecond):
		}
	}

	env, err = podEnv(p, *main)
	if err != nil {
		t.Fatal(err)
	}
	mounts = pp.hostPaths(*main, env)
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		env[i] = k + "=" + remapMount(v, mounts)
	}
	cmd := append(append([]string{}, main.Command...), main.Args...)
	for i := range cmd {
		cmd[i] = kubeExpand(cmd[i], env)
	}
	env = append(env, "PATH="+fakeBin+":"+os.Getenv("PATH"), "PYTHONUNBUFFERED=1",
		fmt.Sprintf("SPOTAGENT_TEST_MASTER_PORT=%d", cmp.Or(masterPort, ports[2])))
	pp.trainer = pp.run(main.Name, cmd[0], cmd[1:], env)
	return pp
}

func (pp *procPod) run(name, path string, args, env []string) *exec.Cmd {
	logf, err := os.Create(filepath.Join(pp.dir, name+".log"))
	if err != nil {
		pp.t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Dir = pp.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		pp.t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	pp.mu.Lock()
	pp.done[cmd] = done
	pp.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		code := int32(cmd.ProcessState.ExitCode())
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int32(ws.Signal())
		}
		pp.mu.Lock()
		pp.codes[cmd] = code
		pp.mu.Unlock()
		close(done)
	}()
	pp.t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	return cmd
}

func (pp *procPod) code(c *exec.Cmd) int32 {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.codes[c]
}

func (pp *procPod) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(pp.dir, name+".log"))
	return tail(string(b), 3000)
}

// terminate is the kubelet's pod termination: SIGTERM to the trainer
// container's process, then, once it exited, to the sidecar; SIGKILL to
// whatever is left at the grace period's end. It returns the exit codes
// by container name.
func (pp *procPod) terminate(grace time.Duration) map[string]int32 {
	deadline := time.Now().Add(grace)
	for _, c := range []*exec.Cmd{pp.trainer, pp.sidecar} {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-pp.done[c]:
		case <-time.After(time.Until(deadline)):
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-pp.done[c]
		}
	}
	return map[string]int32{"spotagent": pp.code(pp.sidecar), pp.pod.Spec.Containers[0].Name: pp.code(pp.trainer)}
}

// trainerSays waits until the trainer's log matches re and returns the match.
func (pp *procPod) trainerSays(re *regexp.Regexp, timeout time.Duration) []string {
	pp.t.Helper()
	name := pp.pod.Spec.Containers[0].Name
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(filepath.Join(pp.dir, name+".log"))
		if ms := re.FindAllStringSubmatch(string(b), -1); len(ms) > 0 {
			return ms[len(ms)-1]
		}
		select {
		case <-pp.done[pp.trainer]:
			pp.t.Fatalf("the trainer of %s exited %d before printing %s:\n%s\n--- sidecar:\n%s", pp.pod.Name, pp.code(pp.trainer), re, pp.log(name), pp.log("spotagent"))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			pp.t.Fatalf("the trainer of %s did not print %s within %s:\n%s\n--- sidecar:\n%s", pp.pod.Name, re, timeout, pp.log(name), pp.log("spotagent"))
		}
	}
}

// podStart bounds the waits on a played pod's processes (the sidecar ready,
// torch imported, torchrun's rendezvous, a rank's first line): generous,
// since the deploy tests run several pods of real torch ranks at once (8
// ranks on 2 cores took over a minute to print their first step).
const podStart = 4 * time.Minute

// The lines of python/examples/train_ddp.py's rank 0.
var (
	stepRE    = regexp.MustCompile(`(?m)^rank 0 step (\d+)$`)
	stoppedRE = regexp.MustCompile(`(?m)^rank 0 checkpoint \S* ?\((?:shutdown|interruption)\) at step (\d+)`)
	resumedRE = regexp.MustCompile(`(?m)^rank 0 resuming from step (\d+)`)
)

// fakeTorchrun is the trainer image's PATH: a `torchrun` that runs the
// real torchrun (python/examples/torchrun.py) on one node of 2 ranks of
// python/examples/train_ddp.py, whatever node flags the manifest's script
// passes (its rank 0 address is a cluster DNS name). Two ranks: a process
// group of one is not a distributed job to the client, whose SIGTERM
// checkpoint a sidecar with --node-rank refuses (a multi-node job's
// checkpoints are the agents' to ask for).
func fakeTorchrun(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
export TOTAL_STEPS=1000000 STEP_SLEEP_MS=40 PYTHONPATH=%[1]s/python
exec /usr/bin/python3 %[1]s/python/examples/torchrun.py --nnodes=1 --nproc_per_node=2 --node_rank=0 \
  --master_addr=127.0.0.1 --master_port="$SPOTAGENT_TEST_MASTER_PORT" %[1]s/python/examples/train_ddp.py
`, repo)
	if err := os.WriteFile(filepath.Join(dir, "torchrun"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ---------------------------------------------------------------- the test

// kueueJobSet is multinode-jobset.yaml as a Kueue workload: the queue and
// priority labels, one node (one pod's processes run here).
func kueueJobSet(t *testing.T, queue, priority string) (manifestDoc, string) {
	t.Helper()
	_, doc := readJobSet(t)
	var obj map[string]any
	if err := yaml.Unmarshal(doc.yaml, &obj); err != nil {
		t.Fatal(err)
	}
	md := obj["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
	}
	labels["kueue.x-k8s.io/queue-name"] = queue
	labels["kueue.x-k8s.io/priority-class"] = priority
	md["labels"] = labels
	rj := obj["spec"].(map[string]any)["replicatedJobs"].([]any)[0].(map[string]any)
	job := rj["template"].(map[string]any)["spec"].(map[string]any)
	job["parallelism"], job["completions"] = 1, 1
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	doc.yaml = out
	return doc, md["name"].(string)
}

// urgentJobSet is a production-priority JobSet that needs the whole
// ClusterQueue: 2 pods of 8 GPUs.
func urgentJobSet(queue string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: urgent
  labels:
    kueue.x-k8s.io/queue-name: %s
    kueue.x-k8s.io/priority-class: production
spec:
  replicatedJobs:
    - name: node
      replicas: 1
      template:
        spec:
          parallelism: 2
          completions: 2
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: trainer
                  image: my-registry.example.com/my-trainer:latest
                  resources:
                    requests: {cpu: "8", memory: 48Gi, nvidia.com/gpu: 8}
                    limits: {nvidia.com/gpu: 8}
`, queue))
}

// workloadOf returns the Kueue Workload of the JobSet name and its
// conditions by type.
func workloadOf(t *testing.T, cp *controlPlane, ns, name string) map[string]metav1.Condition {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Status   struct {
				Conditions []metav1.Condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := cp.do(http.MethodGet, resourcePath("kueue.x-k8s.io/v1beta2", "Workload", ns, ""), "", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, w := range list.Items {
		for _, o := range w.Metadata.OwnerReferences {
			if o.Kind == "JobSet" && o.Name == name {
				conds := map[string]metav1.Condition{}
				for _, c := range w.Status.Conditions {
					conds[c.Type] = c
				}
				return conds
			}
		}
	}
	return nil
}

// TestK8sKueuePreemption: a research-priority JobSet is admitted and
// trains; a production JobSet that needs the whole ClusterQueue preempts
// it: Kueue suspends the JobSet, the JobSet and Job controllers delete its
// pod, the kubelet's SIGTERM makes the trainer checkpoint (committed by the
// sidecar) and exit 75; once the production JobSet is gone Kueue readmits
// the research one, whose new pod resumes from that checkpoint. The JobSet's
// counted restarts stay 0 (jobset#1117: a preemption must not spend the
// crash budget).
func TestK8sKueuePreemption(t *testing.T) {
	needControllers(t)
	t.Parallel()
	cp := runKueueController(t)
	agent := spotagentBinary(t)
	ns := "kueue-" + randSuffix()
	nsObj := corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{kueueNamespaceLabel: "true"}}}
	if err := cp.do(http.MethodPost, "/api/v1/namespaces", "", nsObj, nil); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount the JobSet's pods run as, from the same file.
	for _, d := range manifestDocs(t, jobSetPath) {
		if d.kind == "ServiceAccount" {
			cp.applySoon(t, d, ns)
		}
	}
	var queue string
	for _, d := range manifestDocs(t, kueueQueuesPath) {
		if d.kind == "LocalQueue" {
			queue = d.name
		}
		cp.applySoon(t, d, ns)
	}

	store := t.TempDir()
	fakeBin := fakeTorchrun(t)

	doc, name := kueueJobSet(t, queue, "research")
	if err := cp.apply(t, doc, ns); err != nil {
		t.Fatal(err)
	}
	j := cp.newJobRun(t, ns, name)
	j.jobSelect = "jobset.sigs.k8s.io/jobset-name=" + name
	waitFor(t, 2*time.Minute, "the research JobSet admitted", func() (bool, error) {
		c, ok := workloadOf(t, cp, ns, name)["Admitted"]
		return ok && c.Status == metav1.ConditionTrue, nil
	})
	fresh, _ := j.newPods(1, 2*time.Minute)
	pp := startProcPod(t, fresh[0], agent, store, fakeBin)
	pod := j.start(fresh...)[0]
	pp.trainerSays(stepRE, podStart)

	// The preemption.
	preempted := time.Now()
	urgent := manifestDoc{path: "urgent", apiVersion: "jobset.x-k8s.io/v1alpha2", kind: "JobSet", name: "urgent", yaml: urgentJobSet(queue)}
	if err := cp.apply(t, urgent, ns); err != nil {
		t.Fatal(err)
	}
	var evicted metav1.Condition
	waitFor(t, 2*time.Minute, "Kueue to evict the research workload", func() (bool, error) {
		c, ok := workloadOf(t, cp, ns, name)["Evicted"]
		if ok && c.Status == metav1.ConditionTrue {
			evicted = c
			return true, nil
		}
		return false, nil
	})
	if evicted.Reason != "Preempted" {
		t.Errorf("evicted for %s (%s), want Preempted", evicted.Reason, evicted.Message)
	}
	// The Job controller deletes the pod once the JobSet controller has
	// suspended its Job: the kubelet's part follows.
	waitFor(t, 2*time.Minute, "the pod deleted", func() (bool, error) {
		var p corev1.Pod
		err := cp.do(http.MethodGet, resourcePath("v1", "Pod", ns, pod.Name), "", nil, &p)
		return err == nil && p.DeletionTimestamp != nil, err
	})
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	codes := pp.terminate(grace)
	trainerName := pod.Spec.Containers[0].Name
	t.Logf("preempted: trainer exited %d, sidecar %d, %s after the production JobSet", codes[trainerName], codes["spotagent"], time.Since(preempted).Round(100*time.Millisecond))
	if codes[trainerName] != 75 {
		t.Errorf("trainer exit %d after the preemption's SIGTERM, want 75:\n%s\n--- sidecar:\n%s", codes[trainerName], pp.log(trainerName), pp.log("spotagent"))
	}
	stopped := stoppedRE.FindAllStringSubmatch(pp.log(trainerName), -1)
	if len(stopped) == 0 {
		t.Fatalf("the trainer took no checkpoint on SIGTERM:\n%s", pp.log(trainerName))
	}
	saved, _ := strconv.Atoi(stopped[len(stopped)-1][1])
	j.exit(pod, codes)
	j.forget(pod)

	// Readmitted once the production JobSet is gone.
	if err := cp.do(http.MethodDelete, resourcePath("jobset.x-k8s.io/v1alpha2", "JobSet", ns, "urgent"), "",
		map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}, nil); err != nil {
		t.Fatal(err)
	}
	fresh, at := j.newPods(1, 2*time.Minute)
	pp = startProcPod(t, fresh[0], agent, store, fakeBin)
	pod = j.start(fresh...)[0]
	m := pp.trainerSays(resumedRE, podStart)
	resumed, _ := strconv.Atoi(m[1])
	if resumed != saved {
		t.Errorf("resumed from step %d, want %d (the preemption's checkpoint)", resumed, saved)
	}
	restarts, counted := jobSetRestarts(t, cp, ns, name)
	if counted != 0 {
		t.Errorf("the preemption counted against maxRestarts: restarts %d, counted %d", restarts, counted)
	}
	t.Logf("readmitted: new pod %s after the production JobSet's deletion, resumed from step %d (JobSet restarts %d, counted %d)",
		time.Since(at).Round(100*time.Millisecond), resumed, restarts, counted)
	codes = pp.terminate(grace)
	j.exit(pod, codes)
}

// spotagentBinary builds ./cmd/spotagent once per test binary.
var spotagentBuild struct {
	once sync.Once
	path string
	err  error
}

func spotagentBinary(t *testing.T) string {
	t.Helper()
	spotagentBuild.once.Do(func() {
		if p := os.Getenv("SPOTAGENT_BIN"); p != "" {
			spotagentBuild.path, spotagentBuild.err = filepath.Abs(p)
			return
		}
		dir, err := os.MkdirTemp("", "spotagent-deploy-bin-")
		if err != nil {
			spotagentBuild.err = err
			return
		}
		spotagentBuild.path = filepath.Join(dir, "spotagent")
		cmd := exec.Command("go", "build", "-tags", "disable_grpc_modules,grpcnotrace", "-o", spotagentBuild.path, "../cmd/spotagent")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			spotagentBuild.err = fmt.Errorf("go build ./cmd/spotagent: %w\n%s", err, stderr.String())
		}
	})
	if spotagentBuild.err != nil {
		t.Fatal(spotagentBuild.err)
	}
	return spotagentBuild.path
}

// TestSuspendedPodCheckpointsAndResumes is the kubelet's half of a Kueue
// preemption without the control plane: multinode-jobset.yaml's pod (one
// node), its containers run here as TestK8sKueuePreemption runs them, gets
// the SIGTERM of a suspended Job's pod deletion; the trainer checkpoints and
// exits 75, the sidecar 0; the pod that replaces it when the workload is
// readmitted (same store, fresh volumes) resumes from that checkpoint.
func TestSuspendedPodCheckpointsAndResumes(t *testing.T) {
	t.Parallel()
	agent := spotagentBinary(t)
	js, _ := readJobSet(t)
	store, fakeBin := t.TempDir(), fakeTorchrun(t)
	pod := func(name string) corev1.Pod {
		tmpl := js.Spec.ReplicatedJobs[0].Template.Spec.Template
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kueue",
				Labels:      map[string]string{"jobset.sigs.k8s.io/jobset-name": js.Metadata.Name},
				Annotations: map[string]string{"batch.kubernetes.io/job-completion-index": "0"}},
			Spec: *tmpl.Spec.DeepCopy(),
		}
	}
	trainer := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Name
	pp := startProcPod(t, pod("exp42-node-0-0-aaaaa"), agent, store, fakeBin)
	pp.trainerSays(stepRE, podStart)
	codes := pp.terminate(110 * time.Second)
	if codes[trainer] != 75 || codes["spotagent"] != 0 {
		t.Fatalf("exit codes %v, want %s 75, spotagent 0:\n%s\n--- sidecar:\n%s", codes, trainer, pp.log(trainer), pp.log("spotagent"))
	}
	stopped := stoppedRE.FindAllStringSubmatch(pp.log(trainer), -1)
	if len(stopped) == 0 {
		t.Fatalf("the trainer took no checkpoint on SIGTERM:\n%s", pp.log(trainer))
	}
	t.Logf("--- trainer:\n%s\n--- sidecar:\n%s", tail(pp.log(trainer), 600), pp.log("spotagent"))
	pp = startProcPod(t, pod("exp42-node-0-0-bbbbb"), agent, store, fakeBin)
	m := pp.trainerSays(resumedRE, podStart)
	if m[1] != stopped[len(stopped)-1][1] {
		t.Errorf("resumed from step %s, want %s (the SIGTERM checkpoint)", m[1], stopped[len(stopped)-1][1])
	}
	pp.terminate(110 * time.Second)
}
