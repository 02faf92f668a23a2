package deploy

// The Helm chart (deploy/helm/spotagent): linted and rendered by the real
// Helm v4 (scripts/helm-build.sh builds it from the Go module proxy), the
// plain manifests in kubernetes/ are its output (make manifests), and bad
// values fail the render with a message naming the value.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

const chartDir = "helm/spotagent"

var helmBuild struct {
	once sync.Once
	bin  string
	err  error
}

// helmBin builds (or finds) Helm and returns its path.
func helmBin(t *testing.T) string {
	t.Helper()
	helmBuild.once.Do(func() {
		cmd := exec.Command("../scripts/helm-build.sh")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		if err != nil {
			helmBuild.err = fmt.Errorf("helm-build.sh: %w\n%s", err, tail(stderr.String(), 4000))
			return
		}
		if d := time.Since(start); d > 10*time.Second {
			fmt.Fprintf(os.Stderr, "helm: built in %s\n", d.Round(time.Second))
		}
		helmBuild.bin = strings.TrimSpace(string(out))
	})
	if helmBuild.err != nil {
		t.Fatal(helmBuild.err)
	}
	return helmBuild.bin
}

// helm runs the helm binary and returns stdout, or an error with stderr.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String()+stdout.String())
	}
	return stdout.String(), nil
}

func examples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("helm/examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no chart examples: %v", err)
	}
	kueue, err := filepath.Glob("helm/examples/kueue/*.yaml")
	if err != nil || len(kueue) == 0 {
		t.Fatalf("no Kueue chart examples: %v", err)
	}
	kubeflow, err := filepath.Glob("helm/examples/kubeflow/*.yaml")
	if err != nil || len(kubeflow) == 0 {
		t.Fatalf("no Kubeflow chart examples: %v", err)
	}
	return append(append(files, kueue...), kubeflow...)
}

// TestHelmLint: `helm lint --strict` passes with every example's values.
func TestHelmLint(t *testing.T) {
	for _, f := range examples(t) {
		if out, err := helm(t, "lint", "--strict", chartDir, "--values", f); err != nil {
			t.Errorf("%s: %v\n%s", f, err, out)
		}
	}
}

// TestHelmManifestsUpToDate: every file in kubernetes/, kueue/ and
// kubeflow/ is what `make manifests` renders from the chart now, and nothing
// else is there (but kubeflow/'s TrainJob example, written by hand).
func TestHelmManifestsUpToDate(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("../scripts/manifests.sh", out)
	cmd.Env = append(os.Environ(), "HELM="+helmBin(t), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir())
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("manifests.sh: %v\n%s", err, b)
	}
	for _, dir := range []string{"kubernetes", "kueue", "kubeflow"} {
		rendered := out
		if dir != "kubernetes" {
			rendered = filepath.Join(out, dir)
		}
		manifestsMatch(t, rendered, dir, filepath.Base(trainJobPath))
	}
}

// manifestsMatch compares the rendered files in out with those in dir;
// handWritten names files of dir that are not rendered.
func manifestsMatch(t *testing.T, out, dir string, handWritten ...string) {
	t.Helper()
	want, _ := filepath.Glob(filepath.Join(out, "*.yaml"))
	got, _ := filepath.Glob(dir + "/*.yaml")
	names := func(fs []string) []string {
		var n []string
		for _, f := range fs {
			if slices.Contains(handWritten, filepath.Base(f)) {
				continue
			}
			n = append(n, filepath.Base(f))
		}
		sort.Strings(n)
		return n
	}
	if w, g := strings.Join(names(want), " "), strings.Join(names(got), " "); w != g {
		t.Errorf("%s/ holds %s; the chart's examples render %s: run make manifests", dir, g, w)
	}
	for _, f := range want {
		if read(t, f) != read(t, filepath.Join(dir, filepath.Base(f))) {
			t.Errorf("%s/%s differs from the chart's rendering: run make manifests (never edit it by hand)", dir, filepath.Base(f))
		}
	}
}

// render runs helm template with the sidecar example and the given --set
// values, into a temp file, and returns its path and the error.
func render(t *testing.T, example string, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", "r", chartDir, "--values", "helm/examples/" + example + ".yaml"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	p := filepath.Join(t.TempDir(), "out.yaml")
	if werr := os.WriteFile(p, []byte(out), 0o600); werr != nil {
		t.Fatal(werr)
	}
	return p, err
}

// TestHelmValuesRefused (#45): a missing or malformed value fails the
// render with a message naming it, never a pod that crashes.
func TestHelmValuesRefused(t *testing.T) {
	for _, tc := range []struct {
		example string
		set     []string
		want    string // in the error
	}{
		{"sidecar-job", []string{"store="}, "store"},
		{"sidecar-job", []string{"store=my-bucket/runs/exp41"}, "store"},
		{"sidecar-job", []string{"store=s3://"}, "store"},
		{"sidecar-job", []string{"store=http://example.com/x"}, "store"},
		{"multinode-jobset", []string{"store="}, "store"},
		{"sidecar-job", []string{"runId="}, "runId"},
		{"sidecar-job", []string{"runId=Exp_41"}, "runId"},
		{"sidecar-job", []string{"runId=a-run-id-far-too-long-for-the-jobset-pod-names"}, "runId"},
		{"node-trainer-job", []string{"runId="}, "runId"},
		{"sidecar-job", []string{"image.agent="}, "agent"},
		{"sidecar-job", []string{"image.trainer=my image"}, "trainer"},
		{"sidecar-job", []string{"workload=multi"}, "workload"},
		{"sidecar-job", []string{"nodes=0"}, "nodes"},
		{"sidecar-job", []string{"copies.where=pvc"}, "where"},
		{"sidecar-job", []string{"peerRestore.replicas=2"}, "replicas"},
		{"sidecar-job", []string{"kueue.queueName=Bad Queue"}, "queueName"},
		{"sidecar-job", []string{"kueue.queues.enabled=true"}, "queueName"},
		{"sidecar-job", []string{"kueue.queueName=team-a", "kueue.queues.enabled=true", "kueue.queues.quota.cpu=lots"}, "quota"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.storePrefix="}, "storePrefix"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.storePrefix=s3://my-bucket/runs"}, "storePrefix"},
		{"kubeflow/torch-distributed-spotagent", []string{"image.agent="}, "agent"},
		{"kubeflow/torch-distributed-spotagent", []string{"image.trainer="}, "trainer"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.name=Torch_Spot"}, "name"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.networkPolicy.namespaces={Team_A}"}, "namespaces"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.networkPolicy.namespaces={team-a,team-a}"}, "namespaces"},
		{"kubeflow/torch-distributed-spotagent", []string{"kubeflow.runtime.name=" + strings.Repeat("a", 64)}, "kubeflow.runtime.name"},
		{"daemonset", []string{"nodeAgent.storePrefix=s3://my-bucket/runs"}, "storePrefix"},
		{"daemonset", []string{"nodeAgent.storePrefix="}, "storePrefix"},
	} {
		_, err := render(t, tc.example, tc.set...)
		if err == nil {
			t.Errorf("%s %v: rendered", tc.example, tc.set)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: error does not name %s: %v", tc.example, tc.set, tc.want, err)
		}
	}
}

// TestHelmValues: the values reach the objects.
func TestHelmValues(t *testing.T) {
	t.Run("kueue", func(t *testing.T) {
		for _, ex := range []string{"sidecar-job", "multinode-job", "node-trainer-job"} {
			p, err := render(t, ex, "kueue.queueName=team-a")
			if err != nil {
				t.Fatal(err)
			}
			job := only[*batchv1.Job](t, decodeManifests(t, p))
			if job.Labels["kueue.x-k8s.io/queue-name"] != "team-a" {
				t.Errorf("%s: Job labels %v: no kueue.x-k8s.io/queue-name=team-a", ex, job.Labels)
			}
		}
		p, err := render(t, "multinode-jobset", "kueue.queueName=team-a")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(read(t, p), "kueue.x-k8s.io/queue-name: team-a") {
			t.Error("JobSet: no kueue.x-k8s.io/queue-name label")
		}
		p, _ = render(t, "sidecar-job")
		if strings.Contains(read(t, p), "queue-name") {
			t.Error("a queue label without kueue.queueName")
		}
	})
	t.Run("kueue-queues", func(t *testing.T) {
		p, err := render(t, "sidecar-job", "kueue.queueName=team-a", "kueue.queues.enabled=true", "cloud.provider=aks",
			"kueue.queues.quota.nvidia\\.com/gpu=64")
		if err != nil {
			t.Fatal(err)
		}
		out := read(t, p)
		for _, want := range []string{"kind: LocalQueue\nmetadata:\n  name: team-a", "kubernetes.azure.com/scalesetpriority: spot",
			"- name: nvidia.com/gpu\n              nominalQuota: \"64\"", "coveredResources: [cpu, ephemeral-storage, memory, nvidia.com/gpu]"} {
			if !strings.Contains(out, want) {
				t.Errorf("kueue.queues: no %q in the rendering", want)
			}
		}
		p, _ = render(t, "sidecar-job", "kueue.queueName=team-a")
		if strings.Contains(read(t, p), "kind: ClusterQueue") {
			t.Error("Kueue's objects without kueue.queues.enabled")
		}
	})
	t.Run("kubeflow-runtime", func(t *testing.T) {
		p, err := render(t, "kubeflow/torch-distributed-spotagent", "kubeflow.runtime.name=torch-spot",
			"peerRestore.enabled=false", "copies.where=emptyDir", "fleet=gs://fleet-bucket/all",
			"kubeflow.runtime.storePrefix=gs://my-bucket/team-a/", "kubeflow.runtime.serviceAccountName=team-a-trainer")
		if err != nil {
			t.Fatal(err)
		}
		out := read(t, p)
		for _, want := range []string{"kind: ClusterTrainingRuntime\nmetadata:\n  name: torch-spot",
			`value: "gs://my-bucket/team-a/$(SPOTAGENT_RUN_ID)"`, `value: "gs://fleet-bucket/all"`,
			"serviceAccountName: team-a-trainer", "emptyDir:\n                        sizeLimit: 200Gi"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubeflow.runtime: no %q in the rendering", want)
			}
		}
		for _, not := range []string{"- --peer-restore", "hostPath:", "subPathExpr:", "name: copies"} {
			if strings.Contains(out, not) {
				t.Errorf("kubeflow.runtime with peerRestore off and copies on an emptyDir: %q in the rendering", not)
			}
		}
		// Beside a JobSet in one release: the runtime takes nothing of the run's.
		p, err = render(t, "multinode-jobset", "kubeflow.runtime.enabled=true", "kubeflow.runtime.storePrefix=s3://my-bucket/tj/")
		if err != nil {
			t.Fatal(err)
		}
		out = read(t, p)
		rt := out[strings.Index(out, "kind: ClusterTrainingRuntime"):]
		if i := strings.Index(rt, "\n---"); i >= 0 {
			rt = rt[:i]
		}
		if strings.Contains(rt, "exp44") || !strings.Contains(out, "kind: JobSet") {
			t.Errorf("the runtime beside the JobSet names the JobSet's run exp44, or the JobSet is missing:\n%s", rt)
		}
		p, _ = render(t, "multinode-jobset")
		if strings.Contains(read(t, p), "ClusterTrainingRuntime") {
			t.Error("a ClusterTrainingRuntime without kubeflow.runtime.enabled")
		}
	})
	t.Run("layout", func(t *testing.T) {
		p, err := render(t, "multinode-job", "nodes=4", "processesPerNode=2", "gpusPerNode=2", "peerRestore.replicas=1",
			"copies.where=emptyDir", "copies.sizeLimit=50Gi", "copies.maxBytes=1000000", "grace.sigtermWait=20")
		if err != nil {
			t.Fatal(err)
		}
		objs := decodeManifests(t, p)
		job := only[*batchv1.Job](t, objs)
		spec := job.Spec.Template.Spec
		checkSidecarPodSpec(t, spec)
		if *job.Spec.Completions != 4 || *job.Spec.Parallelism != 4 {
			t.Errorf("completions %d parallelism %d, want 4", *job.Spec.Completions, *job.Spec.Parallelism)
		}
		agent := sidecarOf(spec)
		for flag, want := range map[string]string{"replicas": "1", "local-max-bytes": "1000000"} {
			if got := flagValue(agent, flag); got != want {
				t.Errorf("--%s=%q, want %q", flag, got, want)
			}
		}
		if !contains(agent.Args, "--peer-restore") {
			t.Error("no --peer-restore")
		}
		tr := spec.Containers[0]
		if cmd := strings.Join(tr.Command, " "); !strings.Contains(cmd, "--nnodes=4 --nproc_per_node=2") {
			t.Errorf("torchrun: %s", cmd)
		}
		if g := tr.Resources.Limits["nvidia.com/gpu"]; g.Value() != 2 {
			t.Errorf("GPUs %v, want 2", g)
		}
		if *spec.TerminationGracePeriodSeconds != 20+50+5+15 {
			t.Errorf("terminationGracePeriodSeconds %d, want 90", *spec.TerminationGracePeriodSeconds)
		}
		for _, c := range spec.InitContainers {
			if c.Name == "copies" {
				t.Error("an emptyDir needs no copies init container")
			}
		}
	})
	t.Run("spot", func(t *testing.T) {
		p, err := render(t, "sidecar-job", "spot.aks=false", "spot.requireSpotNode=true")
		if err != nil {
			t.Fatal(err)
		}
		spec := only[*batchv1.Job](t, decodeManifests(t, p)).Spec.Template.Spec
		for _, tol := range spec.Tolerations {
			if tol.Key == "kubernetes.azure.com/scalesetpriority" {
				t.Error("spot.aks=false still tolerates AKS spot")
			}
		}
		a := spec.Affinity
		if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
			t.Fatal("spot.requireSpotNode: no required node affinity")
		}
		terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if !termsMatch(terms, map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}) || termsMatch(terms, map[string]string{"kubernetes.azure.com/scalesetpriority": "spot"}) {
			t.Errorf("terms %v: want EKS spot, not AKS", terms)
		}
	})
	t.Run("metricsFrom", func(t *testing.T) {
		p, err := render(t, "multinode-job", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus")
		if err != nil {
			t.Fatal(err)
		}
		pol := only[*networkingv1.NetworkPolicy](t, decodeManifests(t, p))
		if admits(pol, map[string]string{"app": "other"}, corev1.ProtocolTCP, 9090, nil) || !admits(pol, map[string]string{"app": "prometheus"}, corev1.ProtocolTCP, 9090, nil) {
			t.Error("networkPolicy.metricsFrom does not narrow the metrics port to Prometheus")
		}
	})
}

func termsMatch(terms []corev1.NodeSelectorTerm, labels map[string]string) bool {
	for _, term := range terms {
		if termMatches(term, labels) {
			return true
		}
	}
	return false
}

// TestTrainerDockerfileInstallsClient: the trainer recipe's install line
// (deploy/trainer.Dockerfile) installs the client from python/ with no
// index, as the image build would (no image builder runs in the tests).
func TestTrainerDockerfileInstallsClient(t *testing.T) {
	py := need(t, "python3", "python3")
	if err := exec.Command(py, "-m", "pip", "--version").Run(); err != nil {
		t.Skip("python3 -m pip unavailable (Debian python3-pip): the recipe's pip line cannot run here")
	}
	text := read(t, "trainer.Dockerfile")
	m := regexp.MustCompile(`(?m)^COPY python/ (\S+)$`).FindStringSubmatch(text)
	line := strings.TrimSuffix(strings.TrimSpace(regexp.MustCompile(`python3 -m pip install [^&\n]*`).FindString(text)), "\\")
	if m == nil || line == "" || !strings.Contains(line, "--no-index") {
		t.Fatalf("trainer.Dockerfile: want `COPY python/ DIR` and a `pip install --no-index DIR` line, got %q %q", m, line)
	}
	src := filepath.Join(t.TempDir(), "client")
	if out, err := exec.Command("cp", "-r", "../python", src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	target := filepath.Join(t.TempDir(), "site")
	args := strings.Fields(strings.Replace(line, strings.TrimSuffix(m[1], "/"), src, 1))
	args = append(args[1:], "--target", target)
	cmd := exec.Command(py, args...)
	cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	check := exec.Command(py, "-c", "import spotagent, sys; sys.exit(0 if spotagent.__file__.startswith(sys.argv[1]) else 1)", target)
	check.Env = append(os.Environ(), "PYTHONPATH="+target)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("the installed client does not import from %s: %v %s", target, err, out)
	}
}

// cloudPresets are the managed clouds' values files (helm/clouds) with a
// store and an identity of the right form for each.
var cloudPresets = []struct {
	name, store, identity string
	spotLabel             map[string]string // the preset's nodeSelector
	annotation, taint     string            // the ServiceAccount's identity annotation; the tolerated taint key ("" none)
}{
	{"aks", "az://checkpoints@mystorageaccount/runs/exp45", "11111111-2222-3333-4444-555555555555",
		map[string]string{"kubernetes.azure.com/scalesetpriority": "spot"}, "azure.workload.identity/client-id", "kubernetes.azure.com/scalesetpriority"},
	{"gke", "gs://my-bucket/runs/exp45", "spotagent-trainer@my-project.iam.gserviceaccount.com",
		map[string]string{"cloud.google.com/gke-spot": "true"}, "iam.gke.io/gcp-service-account", "cloud.google.com/gke-spot"},
	{"eks", "s3://my-bucket/runs/exp45", "arn:aws:iam::111122223333:role/spotagent-trainer",
		map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}, "eks.amazonaws.com/role-arn", ""},
}

// renderCloud runs helm template (or lint) with a cloud's values file and
// the values every release must set.
func renderCloud(t *testing.T, cmd, cloud string, set ...string) (string, error) {
	t.Helper()
	args := []string{cmd}
	if cmd == "template" {
		args = append(args, "r")
	} else {
		args = append(args, "--strict")
	}
	args = append(args, chartDir, "--values", "helm/clouds/"+cloud+".yaml",
		"--set", "runId=exp45", "--set", "image.agent=my-registry.example.com/spotagent:v0.1.0",
		"--set", "image.trainer=my-registry.example.com/my-trainer:v1")
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	p := filepath.Join(t.TempDir(), "out.yaml")
	if werr := os.WriteFile(p, []byte(out), 0o600); werr != nil {
		t.Fatal(werr)
	}
	return p, err
}

// TestHelmCloudPresets (#45): the AKS, GKE and EKS values files put the
// pods on that cloud's spot nodes (its node label, the toleration of its
// taint) and map the ServiceAccount to the cloud's workload identity (AKS
// also labels the pods for its webhook); without an identity none is set;
// nodeSelector adds to the preset's; the files lint; a malformed identity
// or an Azure store without its account fails the render naming the value.
func TestHelmCloudPresets(t *testing.T) {
	for _, c := range cloudPresets {
		t.Run(c.name, func(t *testing.T) {
			if out, err := renderCloud(t, "lint", c.name, "store="+c.store, "cloud.identity="+c.identity); err != nil {
				t.Errorf("lint: %v\n%s", err, read(t, out))
			}
			// The JobSet as the file deploys it, and the same pods as an
			// Indexed Job (decoded strictly into the API's types).
			p, err := renderCloud(t, "template", c.name, "store="+c.store, "cloud.identity="+c.identity)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(read(t, p), "kind: JobSet") {
				t.Errorf("%s.yaml does not deploy the JobSet", c.name)
			}
			p, err = renderCloud(t, "template", c.name, "store="+c.store, "cloud.identity="+c.identity,
				"workload=multinode-job", "nodeSelector.nvidia\\.com/gpu\\.product=NVIDIA-H100-80GB-HBM3")
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeManifests(t, p)
			spec := only[*batchv1.Job](t, objs).Spec.Template
			want := map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
			for k, v := range c.spotLabel {
				want[k] = v
			}
			if fmt.Sprint(spec.Spec.NodeSelector) != fmt.Sprint(want) {
				t.Errorf("nodeSelector %v, want %v", spec.Spec.NodeSelector, want)
			}
			var tolerated []string
			for _, tol := range spec.Spec.Tolerations {
				tolerated = append(tolerated, tol.Key)
			}
			for k := range c.spotLabel {
				if c.taint != "" && k == c.taint && !contains(tolerated, c.taint) {
					t.Errorf("tolerations %v: not the spot pool's taint %s", tolerated, c.taint)
				}
			}
			for _, other := range cloudPresets {
				if other.name != c.name && other.taint != "" && contains(tolerated, other.taint) {
					t.Errorf("tolerations %v: %s's taint in the %s preset", tolerated, other.name, c.name)
				}
			}
			sa := only[*corev1.ServiceAccount](t, objs)
			if sa.Annotations[c.annotation] != c.identity || spec.Spec.ServiceAccountName != sa.Name {
				t.Errorf("ServiceAccount %s annotations %v (pods run as %s): want %s=%s", sa.Name, sa.Annotations, spec.Spec.ServiceAccountName, c.annotation, c.identity)
			}
			if got, want := spec.Labels["azure.workload.identity/use"], map[bool]string{true: "true"}[c.name == "aks"]; got != want {
				t.Errorf("pod label azure.workload.identity/use=%q, want %q", got, want)
			}

			// No identity: credentials come from elsewhere; nothing is claimed.
			p, err = renderCloud(t, "template", c.name, "store="+c.store, "workload=multinode-job")
			if err != nil {
				t.Fatal(err)
			}
			objs = decodeManifests(t, p)
			if a := only[*corev1.ServiceAccount](t, objs).Annotations; len(a) != 0 {
				t.Errorf("no identity, yet ServiceAccount annotations %v", a)
			}
			if l := only[*batchv1.Job](t, objs).Spec.Template.Labels; l["azure.workload.identity/use"] != "" {
				t.Errorf("no identity, yet pod labels %v", l)
			}
		})
	}
	for _, tc := range []struct {
		cloud string
		set   []string
		want  string // in the error
	}{
		{"aks", []string{"store=az://checkpoints/runs/exp45"}, "store"}, // the account is in the URI
		{"aks", []string{"store=az://checkpoints@mystorageaccount/runs/exp45", "cloud.identity=spotagent-trainer"}, "identity"},
		{"gke", []string{"store=gs://my-bucket/runs/exp45", "cloud.identity=spotagent-trainer@gmail.com"}, "identity"},
		{"eks", []string{"store=s3://my-bucket/runs/exp45", "cloud.identity=spotagent-trainer"}, "identity"},
		{"eks", []string{"store=s3://my-bucket/runs/exp45", "cloud.provider=azure"}, "provider"},
		{"eks", []string{"store=s3://my-bucket/runs/exp45", "nodeSelector.bad key=x"}, "nodeSelector"},
		{"eks", []string{"store=s3://my-bucket/runs/exp45", "podLabels.team=1"}, "podLabels"},
		{"eks", []string{}, "store"},
	} {
		_, err := renderCloud(t, "template", tc.cloud, tc.set...)
		if err == nil {
			t.Errorf("%s %v: rendered", tc.cloud, tc.set)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: error does not name %s: %v", tc.cloud, tc.set, tc.want, err)
		}
	}
}

// TestK8sCloudPresetsApply: each cloud's values file rendered as shipped
// (the JobSet, its ServiceAccount and NetworkPolicy) is accepted by the real
// API server, server-side and strict, the JobSet against its CRD.
func TestK8sCloudPresetsApply(t *testing.T) {
	t.Parallel()
	cp := sharedControlPlane(t)
	for _, d := range manifestDocs(t, jobSetCRD(t)) {
		if err := cp.apply(t, d, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cloudPresets {
		p, err := renderCloud(t, "template", c.name, "store="+c.store, "cloud.identity="+c.identity)
		if err != nil {
			t.Fatal(err)
		}
		ns := cp.namespace(t, "cloud-"+c.name)
		var kinds []string
		for _, d := range manifestDocs(t, p) {
			kinds = append(kinds, d.kind)
			// The discovery of a new CRD lags its Established condition a little.
			waitFor(t, 60*time.Second, c.name+": "+d.kind+" applied", func() (bool, error) {
				err := cp.apply(t, d, ns)
				if d.kind == "JobSet" && isNotFound(err) {
					return false, nil
				}
				return err == nil, err
			})
		}
		if k := strings.Join(kinds, ","); k != "NetworkPolicy,ServiceAccount,JobSet" {
			t.Errorf("%s: applied %s, want the NetworkPolicy, ServiceAccount and JobSet", c.name, k)
		}
	}
}
