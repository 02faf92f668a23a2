package deploy

// Kubeflow Trainer v2 on the real control plane: the JobSet controller, the
// Trainer's controller manager and (k8s_kueue_test.go) Kueue's, each built
// from the Go module proxy by scripts/controllers-build.sh (make kcp builds
// them before the tests), started on loopback against kcp_test.go's
// apiserver. Webhooks: no cert-manager, no internal certificate rotation
// (each controller's own switch turns it off); each webhook server serves
// the apiserver's own loopback certificate (signed by the test CA), and the
// controllers' webhook configurations, as their modules ship them, are
// registered with a URL clientConfig (https://127.0.0.1:<port><path>) and
// that CA: the apiserver calls the real webhooks.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	trainerRuntimePath = "kubeflow/torch-distributed-spotagent.yaml"
	trainJobPath       = "kubeflow/trainjob-example.yaml"
)

func init() {
	type res = struct {
		plural     string
		namespaced bool
	}
	apiResources["trainer.kubeflow.org/v1alpha1/TrainJob"] = res{"trainjobs", true}
	apiResources["trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"] = res{"clustertrainingruntimes", false}
	apiResources["kueue.x-k8s.io/v1beta2/ResourceFlavor"] = res{"resourceflavors", false}
	apiResources["kueue.x-k8s.io/v1beta2/ClusterQueue"] = res{"clusterqueues", false}
	apiResources["kueue.x-k8s.io/v1beta2/LocalQueue"] = res{"localqueues", true}
	apiResources["kueue.x-k8s.io/v1beta2/WorkloadPriorityClass"] = res{"workloadpriorityclasses", false}
	apiResources["kueue.x-k8s.io/v1beta2/Workload"] = res{"workloads", true}
}

// controllers is what scripts/controllers-build.sh built, once per test
// binary, and which of the controllers run against the shared control plane
// (one each: two JobSet controllers would fight over the same objects).
var controllers struct {
	build           sync.Once
	dir             string
	err             error
	jobset, trainer sync.Once
	kueue           sync.Once
	jobsetErr       error
	trainerErr      error
	kueueErr        error
	cachedOnce      sync.Once
	cached          bool // built before this test binary started
}

func controllersDir(t *testing.T) string {
	t.Helper()
	controllers.build.Do(func() {
		cmd := exec.Command("../scripts/controllers-build.sh")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		if err != nil {
			controllers.err = fmt.Errorf("controllers-build.sh: %w\n%s", err, tail(stderr.String(), 4000))
			return
		}
		if d := time.Since(start); d > 10*time.Second {
			fmt.Fprintf(os.Stderr, "kcp: controllers built in %s\n", d.Round(time.Second))
		}
		controllers.dir = strings.TrimSpace(string(out))
	})
	if controllers.err != nil {
		t.Fatal(controllers.err)
	}
	return controllers.dir
}

// installCRDs applies every CRD in dir and waits until each is established
// and served.
func (cp *controlPlane) installCRDs(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	var names []string
	for _, f := range files {
		for _, d := range manifestDocs(t, f) {
			if d.kind != "CustomResourceDefinition" {
				continue
			}
			if err := cp.apply(t, d, ""); err != nil {
				t.Fatal(err)
			}
			names = append(names, d.name)
		}
	}
	for _, name := range names {
		var c struct {
			Spec struct {
				Group string
				Names struct{ Plural string }
				// Versions served: a controller's REST mapper finds the kind
				// through discovery, which lags Established.
				Versions []struct {
					Name   string
					Served bool
				}
			}
			Status struct{ Conditions []metav1.Condition }
		}
		waitFor(t, 60*time.Second, "CRD "+name+" established", func() (bool, error) {
			if err := cp.do(http.MethodGet, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+name, "", nil, &c); err != nil {
				return false, err
			}
			for _, cond := range c.Status.Conditions {
				if cond.Type == "Established" && cond.Status == metav1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		for _, v := range c.Spec.Versions {
			if !v.Served {
				continue
			}
			gv := "/apis/" + c.Spec.Group + "/" + v.Name
			waitFor(t, 60*time.Second, "discovery of "+name+" in "+gv, func() (bool, error) {
				var list metav1.APIResourceList
				if err := cp.do(http.MethodGet, gv, "", nil, &list); err != nil {
					return false, nil // the group version itself is not served yet
				}
				for _, r := range list.APIResources {
					if r.Name == c.Spec.Names.Plural {
						return true, nil
					}
				}
				return false, nil
			})
		}
	}
}

// startEnv is startPath with extra environment.
func (cp *controlPlane) startEnv(name, path string, env []string, args ...string) error {
	logPath := filepath.Join(cp.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = cp.dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	pr := &kcpProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		pr.err = cmd.Wait()
		f.Close()
		close(pr.done)
	}()
	cp.add(pr)
	return nil
}

// servingCerts copies the apiserver's loopback serving certificate into
// dir as tls.crt and tls.key (controller-runtime's webhook server names).
func (cp *controlPlane) servingCerts(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range [][2]string{{"serving.crt", "tls.crt"}, {"serving.key", "tls.key"}} {
		b, err := os.ReadFile(filepath.Join(cp.dir, f[0]))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f[1]), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// registerWebhooks creates the webhook configurations of a controller's
// shipped manifest, each webhook whose service path keep accepts pointed at
// https://127.0.0.1:port<path> with the test CA; nsLabel, when set, limits
// the namespaced ones to namespaces carrying that label (the other tests'
// namespaces never reach this controller).
func (cp *controlPlane) registerWebhooks(t *testing.T, path, prefix string, port int, keep func(string) bool, nsLabel string) {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(cp.dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range manifestDocs(t, path) {
		var obj map[string]any
		if err := yaml.Unmarshal(d.yaml, &obj); err != nil {
			t.Fatal(err)
		}
		hooks, _ := obj["webhooks"].([]any)
		var kept []any
		for _, h := range hooks {
			hook := h.(map[string]any)
			cc, _ := hook["clientConfig"].(map[string]any)
			svc, _ := cc["service"].(map[string]any)
			p, _ := svc["path"].(string)
			if p == "" || !keep(p) {
				continue
			}
			hook["clientConfig"] = map[string]any{
				"url":      fmt.Sprintf("https://127.0.0.1:%d%s", port, p),
				"caBundle": base64.StdEncoding.EncodeToString(ca),
			}
			if nsLabel != "" {
				hook["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{nsLabel: "true"}}
			}
			kept = append(kept, hook)
		}
		if len(kept) == 0 {
			continue
		}
		obj["webhooks"] = kept
		obj["metadata"] = map[string]any{"name": prefix + "-" + strings.ToLower(d.kind)}
		plural := map[string]string{
			"MutatingWebhookConfiguration":   "mutatingwebhookconfigurations",
			"ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
		}[d.kind]
		if plural == "" {
			t.Fatalf("%s: unexpected %s", path, d.kind)
		}
		if err := cp.do(http.MethodPost, "/apis/admissionregistration.k8s.io/v1/"+plural, "", obj, nil); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}

// runJobSetController starts the JobSet controller once (its CRD first).
func runJobSetController(t *testing.T) *controlPlane {
	t.Helper()
	cp := sharedControlPlane(t)
	dir := controllersDir(t)
	controllers.jobset.Do(func() {
		cp.installCRDs(t, filepath.Join(dir, "crds", "jobset"))
		controllers.jobsetErr = cp.startJobSetController(filepath.Join(dir, "bin", "jobset-controller"))
	})
	if controllers.jobsetErr != nil {
		t.Fatal(controllers.jobsetErr)
	}
	return cp
}

// runTrainerController starts the JobSet controller and the Trainer's
// controller manager once, with the Trainer's CRDs and webhooks.
func runTrainerController(t *testing.T) *controlPlane {
	t.Helper()
	cp := runJobSetController(t)
	dir := controllersDir(t)
	controllers.trainer.Do(func() {
		cp.installCRDs(t, filepath.Join(dir, "crds", "trainer"))
		controllers.trainerErr = cp.startTrainerController(t, dir)
	})
	if controllers.trainerErr != nil {
		t.Fatal(controllers.trainerErr)
	}
	return cp
}

// startTrainerController: certManagement off (its cert-controller rotation
// would write a Secret and patch webhook configurations named for its own
// Deployment); the webhook server on 127.0.0.1 reads its certificate from
// $TMPDIR/k8s-webhook-server/serving-certs (controller-runtime's default:
// the Trainer's Configuration has no certDir); metrics off.
func (cp *controlPlane) startTrainerController(t *testing.T, dir string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	tmp := filepath.Join(cp.dir, "trainer-tmp")
	if err := cp.servingCerts(filepath.Join(tmp, "k8s-webhook-server", "serving-certs")); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
webhook: {host: 127.0.0.1, port: %d}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:%d"}
certManagement: {enable: false}
leaderElection: {leaderElect: false}
`, ports[0], ports[1])
	cfgPath := filepath.Join(cp.dir, "trainer-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := cp.startEnv("trainer-controller-manager", filepath.Join(dir, "bin", "trainer-controller-manager"),
		[]string{"TMPDIR=" + tmp, "KUBECONFIG=" + filepath.Join(cp.dir, "kubeconfig")},
		"--config="+cfgPath); err != nil {
		return err
	}
	if err := cp.waitHTTP("trainer-controller-manager", http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), 120*time.Second); err != nil {
		return err
	}
	cp.registerWebhooks(t, filepath.Join(dir, "webhooks", "trainer.yaml"), "spotagent-test-trainer", ports[0],
		func(string) bool { return true }, "")
	return nil
}

// applySoon applies a document, retrying for a while: a new CRD's
// discovery lags its Established condition, and a controller's webhook or
// informer cache may not have seen an object applied just before.
func (cp *controlPlane) applySoon(t *testing.T, d manifestDoc, ns string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cp.apply(t, d, ns)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// needControllers skips a test of the real Trainer, JobSet and Kueue
// controllers when they are not built: make test's test-go runs these tests
// when scripts/controllers-build.sh has built the controllers into the
// cache (make kcp-controllers: long on 2 cores, the first time) and skips
// them otherwise, never building them inside its timeout;
// SPOTAGENT_K8S_CONTROLLERS=1 (make test-k8s, make test-k8s-controllers)
// runs them always, building the controllers first if need be.
func needControllers(t *testing.T) {
	t.Helper()
	if os.Getenv("SPOTAGENT_K8S_CONTROLLERS") != "" {
		return
	}
	controllers.cachedOnce.Do(func() {
		controllers.cached = exec.Command("../scripts/controllers-build.sh", "--cached").Run() == nil
	})
	if !controllers.cached {
		t.Skip("the JobSet, Trainer and Kueue controllers are not built: make kcp-controllers builds them, make test-k8s builds and runs these tests (docs/kubeflow.md)")
	}
}

// trainerCodes is the kubelet's report for a runtime pod whose trainer
// container (`node`) exited with code; the sidecar exits 0 after it.
func trainerCodes(code int32) map[string]int32 {
	return map[string]int32{"spotagent": 0, "node": code}
}

// jobSetStatus reads a JobSet's restart counters.
func jobSetRestarts(t *testing.T, cp *controlPlane, ns, name string) (restarts, counted int32) {
	t.Helper()
	var s struct {
		Status struct {
			Restarts                int32 `json:"restarts"`
			RestartsCountTowardsMax int32 `json:"restartsCountTowardsMax"`
		} `json:"status"`
	}
	if err := cp.do(http.MethodGet, resourcePath("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name), "", nil, &s); err != nil {
		t.Fatal(err)
	}
	return s.Status.Restarts, s.Status.RestartsCountTowardsMax
}

// TestK8sTrainJob: the shipped ClusterTrainingRuntime and TrainJob on the
// real Trainer controller manager, JobSet controller and Job controller.
// The Trainer makes a JobSet that keeps the runtime's sidecar and exit-code
// rules and adds torchrun's PET_* settings; one rank's exit 75 and a
// disruption (an eviction: DisruptionTarget) each restart the whole set,
// uncounted; a crash restarts it counted; the TrainJob never fails on the
// way.
func TestK8sTrainJob(t *testing.T) {
	needControllers(t)
	t.Parallel()
	cp := runTrainerController(t)
	ns := cp.namespace(t, "trainjob")
	runtime, policies := runtimeDocs(t, trainerRuntimePath)
	cp.applySoon(t, runtime, "")
	for _, d := range policies { // the runtime's NetworkPolicy, in the TrainJob's namespace: the API server takes it
		cp.applySoon(t, d, ns)
	}
	var name string
	for _, d := range manifestDocs(t, trainJobPath) {
		if d.kind == "TrainJob" {
			name = d.name
			// Kueue is not this test's (k8s_kueue_test.go): without Kueue
			// running, the queue label is an inert label.
			d.yaml = bytes.Replace(d.yaml, []byte("kueue.x-k8s.io/queue-name: training"), []byte("spotagent.test/queue-name: training"), 1)
		}
		cp.applySoon(t, d, ns)
	}

	// The JobSet the Trainer built from the runtime.
	var js struct {
		Spec struct {
			Suspend       *bool `json:"suspend"`
			FailurePolicy struct {
				MaxRestarts     int32  `json:"maxRestarts"`
				RestartStrategy string `json:"restartStrategy"`
				Rules           []struct {
					Action              string   `json:"action"`
					OnJobFailureReasons []string `json:"onJobFailureReasons"`
				} `json:"rules"`
			} `json:"failurePolicy"`
			ReplicatedJobs []struct {
				Name     string `json:"name"`
				Template struct {
					Spec struct {
						Parallelism      *int32                 `json:"parallelism"`
						BackoffLimit     *int32                 `json:"backoffLimit"`
						PodFailurePolicy json.RawMessage        `json:"podFailurePolicy"`
						Template         corev1.PodTemplateSpec `json:"template"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"replicatedJobs"`
		} `json:"spec"`
	}
	waitFor(t, 60*time.Second, "the Trainer's JobSet", func() (bool, error) {
		err := cp.do(http.MethodGet, resourcePath("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name), "", nil, &js)
		if isNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	fp := js.Spec.FailurePolicy
	if fp.MaxRestarts != 3 || fp.RestartStrategy != "BlockingRecreate" || len(fp.Rules) != 1 ||
		fp.Rules[0].Action != "RestartJobSetAndIgnoreMaxRestarts" || strings.Join(fp.Rules[0].OnJobFailureReasons, ",") != "PodFailurePolicy" {
		t.Errorf("the JobSet's failurePolicy is not the runtime's: %+v", fp)
	}
	if len(js.Spec.ReplicatedJobs) != 1 {
		t.Fatalf("%d replicatedJobs, want 1", len(js.Spec.ReplicatedJobs))
	}
	rj := js.Spec.ReplicatedJobs[0].Template.Spec
	if rj.Parallelism == nil || *rj.Parallelism != 2 || rj.BackoffLimit == nil || *rj.BackoffLimit != 0 {
		t.Errorf("child Job: parallelism %v backoffLimit %v, want 2 (the TrainJob's numNodes) and 0", rj.Parallelism, rj.BackoffLimit)
	}
	if !bytes.Contains(rj.PodFailurePolicy, []byte(`"containerName":"node"`)) || !bytes.Contains(rj.PodFailurePolicy, []byte("DisruptionTarget")) {
		t.Errorf("child Job's podFailurePolicy lost the runtime's rules: %s", rj.PodFailurePolicy)
	}
	// The runtime's NetworkPolicy selects the pods of the JobSet the
	// Trainer built (labelled as the JobSet controller labels them).
	for _, d := range policies {
		var pol networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict(d.yaml, &pol); err != nil {
			t.Fatal(err)
		}
		checkRuntimePolicy(t, &pol, rj.Template, name)
	}
	pod := rj.Template.Spec
	// The chart's JobSet pod (kubeflow.runtime): the copies' init
	// container, then the sidecar, on the hostPath copies, with the peer tier.
	if len(pod.InitContainers) != 2 || pod.InitContainers[0].Name != "copies" || pod.InitContainers[1].Name != "spotagent" {
		t.Fatalf("the pods' init containers are not copies and the spotagent sidecar: %+v", pod.InitContainers)
	}
	sidecar := pod.InitContainers[1]
	if !slices.Contains(sidecar.Args, "--peer-restore") {
		t.Errorf("sidecar args %q: no --peer-restore", sidecar.Args)
	}
	for _, e := range sidecar.Env {
		if e.Name == "SPOTAGENT_STORE" && e.Value != "s3://my-bucket/runs/$(SPOTAGENT_RUN_ID)" {
			t.Errorf("sidecar SPOTAGENT_STORE %q: not kubeflow.runtime.storePrefix + the run id", e.Value)
		}
	}
	if sidecar.Image != "my-registry.example.com/spotagent:v0.1.0" {
		t.Errorf("sidecar image %q: not the chart's image.agent", sidecar.Image)
	}
	copiesVolume := false
	for _, v := range pod.Volumes {
		if v.Name == "checkpoints" && v.HostPath != nil && v.HostPath.Path == "/var/lib/spotagent-copies" {
			copiesVolume = true
		}
	}
	if !copiesVolume {
		t.Errorf("no hostPath checkpoints volume at /var/lib/spotagent-copies: %+v", pod.Volumes)
	}
	subPath := func(c corev1.Container) string {
		for _, m := range c.VolumeMounts {
			if m.Name == "checkpoints" {
				return m.SubPathExpr
			}
		}
		return ""
	}
	const wantSubPath = "$(POD_NAMESPACE)/$(SPOTAGENT_RUN_ID)/node-$(JOB_COMPLETION_INDEX)"
	if got := subPath(sidecar); got != wantSubPath {
		t.Errorf("sidecar checkpoints subPathExpr %q, want %q", got, wantSubPath)
	}
	env := map[string]string{}
	for _, c := range pod.Containers {
		if c.Name != "node" {
			continue
		}
		if got := subPath(c); got != wantSubPath {
			t.Errorf("node checkpoints subPathExpr %q, want %q", got, wantSubPath)
		}
		for _, e := range c.Env {
			env[e.Name] = e.Value
			if e.Name == "SPOTAGENT_RUN_ID" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil ||
				e.ValueFrom.FieldRef.FieldPath != "metadata.labels['jobset.sigs.k8s.io/jobset-name']") {
				t.Errorf("node SPOTAGENT_RUN_ID is not the JobSet's name label: %+v", e.ValueFrom)
			}
		}
		if _, ok := env["SPOTAGENT_RUN_ID"]; !ok {
			t.Error("node has no SPOTAGENT_RUN_ID (its copies' subPathExpr needs it)")
		}
		if got := strings.Join(c.Args, " "); got != "train.py --config configs/exp42.yaml" {
			t.Errorf("node args %q: want the TrainJob's", got)
		}
		if len(c.Command) < 3 || !strings.Contains(c.Command[2], `torchrun "$@"`) {
			t.Errorf("node command is not the runtime's wrapper: %q", c.Command)
		}
	}
	want := map[string]string{"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8",
		"PET_MASTER_ADDR": name + "-node-0-0." + name, "PET_MASTER_PORT": "29500", "SPOTAGENT_HANDLE_SIGTERM": "1"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("node env %s=%q, want %q", k, env[k], v)
		}
	}

	// The pods, played: the JobSet's child Job is <name>-node-0.
	j := cp.newJobRun(t, ns, name)
	j.jobSelect = "jobset.sigs.k8s.io/jobset-name=" + name
	// stop plays the kubelet for the pods being deleted: a running one's
	// trainer ends on SIGTERM (143 here: these pods run no trainer), and
	// every deleted pod is removed once terminated.
	stop := func() {
		for _, p := range j.pods() {
			if p.DeletionTimestamp == nil {
				continue
			}
			if p.Status.Phase == corev1.PodRunning {
				j.exit(p, trainerCodes(143))
			}
			j.forget(p)
		}
	}
	startSet := func(timeout time.Duration) []corev1.Pod {
		var fresh []corev1.Pod
		waitFor(t, timeout, "the set's 2 new pods", func() (bool, error) {
			stop()
			fresh = fresh[:0]
			for _, p := range j.pods() {
				if !j.seen[p.UID] {
					fresh = append(fresh, p)
				}
			}
			return len(fresh) == 2, nil
		})
		for _, p := range fresh {
			j.seen[p.UID] = true
		}
		pods := j.start(fresh...)
		if completionIndex(pods[0]) > completionIndex(pods[1]) {
			pods[0], pods[1] = pods[1], pods[0]
		}
		return pods
	}
	trainJobFailed := func() string {
		var tj struct {
			Status struct{ Conditions []metav1.Condition }
		}
		if err := cp.do(http.MethodGet, resourcePath("trainer.kubeflow.org/v1alpha1", "TrainJob", ns, name), "", nil, &tj); err != nil {
			t.Fatal(err)
		}
		for _, c := range tj.Status.Conditions {
			if c.Type == "Failed" && c.Status == metav1.ConditionTrue {
				return c.Reason + ": " + c.Message
			}
		}
		return ""
	}
	pods := startSet(60 * time.Second)
	for _, p := range pods {
		if p.Spec.Subdomain != name {
			t.Errorf("pod %s subdomain %q, want %q (PET_MASTER_ADDR resolves through it)", p.Name, p.Spec.Subdomain, name)
		}
	}

	steps := []struct {
		what    string
		act     func(pods []corev1.Pod)
		counted int32
	}{
		{"rank 1 exits 75", func(pods []corev1.Pod) { j.exit(pods[1], trainerCodes(75)) }, 0},
		{"rank 0 evicted (DisruptionTarget)", func(pods []corev1.Pod) {
			j.evict(pods[0])
			var evicted corev1.Pod
			if err := cp.do(http.MethodGet, resourcePath("v1", "Pod", ns, pods[0].Name), "", nil, &evicted); err != nil {
				t.Fatal(err)
			}
			j.exit(evicted, trainerCodes(75))
			j.forget(evicted)
		}, 0},
		{"rank 0 crashes (exit 1)", func(pods []corev1.Pod) { j.exit(pods[0], trainerCodes(1)) }, 1},
	}
	for i, s := range steps {
		at := time.Now()
		s.act(pods)
		pods = startSet(2 * time.Minute)
		restarts, counted := jobSetRestarts(t, cp, ns, name)
		if restarts != int32(i+1) || counted != s.counted {
			t.Errorf("after %s: JobSet restarts %d, counted %d; want %d, %d", s.what, restarts, counted, i+1, s.counted)
		}
		if f := trainJobFailed(); f != "" {
			t.Fatalf("after %s: TrainJob failed (%s)", s.what, f)
		}
		t.Logf("%s: new set after %s (restarts %d, counted %d)", s.what, time.Since(at).Round(100*time.Millisecond), restarts, counted)
	}
	if js.Spec.Suspend != nil && *js.Spec.Suspend {
		t.Error("the JobSet was created suspended without Kueue")
	}
}

// TestK8sTrainJobRestartReusesCopies: the shipped TrainJob on the shipped
// runtime (the chart's rendering) keeps copies that outlive its pods, as
// the chart's JobSet does (TestK8sJobSetRestartReusesCopies): the real
// Trainer's JobSet, 2 nodes × 2 real torch ranks played on two nodes,
// the copies' hostPath at $(SPOTAGENT_RUN_ID)/node-$(JOB_COMPLETION_INDEX)
// (the TrainJob's name from the JobSet's label), torchrun's node rank from
// the Trainer's PET_NODE_RANK; after a drain the set comes back on the
// same nodes and every node restores from its copy, 0 bytes from the
// store, uncounted.
func TestK8sTrainJobRestartReusesCopies(t *testing.T) {
	needControllers(t)
	t.Parallel()
	cp := runTrainerController(t)
	agent := spotagentBinary(t)
	ns := cp.namespace(t, "tjcopies")
	runtime, _ := runtimeDocs(t, trainerRuntimePath)
	cp.applySoon(t, runtime, "")
	var name string
	for _, d := range manifestDocs(t, trainJobPath) {
		if d.kind == "TrainJob" {
			name = d.name
			d.yaml = bytes.Replace(d.yaml, []byte("kueue.x-k8s.io/queue-name: training"), []byte("spotagent.test/queue-name: training"), 1)
		}
		cp.applySoon(t, d, ns)
	}
	var js struct {
		Spec struct {
			ReplicatedJobs []struct {
				Template struct {
					Spec struct {
						Template corev1.PodTemplateSpec `json:"template"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"replicatedJobs"`
		} `json:"spec"`
	}
	waitFor(t, 60*time.Second, "the Trainer's JobSet", func() (bool, error) {
		err := cp.do(http.MethodGet, resourcePath("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name), "", nil, &js)
		if isNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	spec := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec
	if !hasHostPath(spec.Volumes, "checkpoints") {
		t.Fatalf("%s: the checkpoints volume is not a hostPath", trainerRuntimePath)
	}
	restartsReuseCopies(t, cp, ns, name, spec, agent, fakeTorchrunNodes(t), false)
}

// runtimeDocs is path's ClusterTrainingRuntime and its NetworkPolicies.
func runtimeDocs(t *testing.T, path string) (manifestDoc, []manifestDoc) {
	t.Helper()
	var rt []manifestDoc
	var pols []manifestDoc
	for _, d := range manifestDocs(t, path) {
		switch d.kind {
		case "ClusterTrainingRuntime":
			rt = append(rt, d)
		case "NetworkPolicy":
			pols = append(pols, d)
		default:
			t.Fatalf("%s: unexpected %s %s", path, d.kind, d.name)
		}
	}
	if len(rt) != 1 {
		t.Fatalf("%s: %d ClusterTrainingRuntimes, want 1", path, len(rt))
	}
	return rt[0], pols
}
