package deploy

// The manifests against a real control plane (kcp_test.go): every document
// in kubernetes/ is applied as written (server-side apply, strict field
// validation), and the real Job and DaemonSet controllers react to what a
// scheduler and kubelet played here report: the exit paths deploy/README.md
// promises, measured.

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// The Job controller's pod-failure backoff (pkg/controller/job): 10 s after
// the first failure, doubling per failure since the last success.
const jobBackoff = 10 * time.Second

// manifestDoc is one YAML document of a manifest file, as written.
type manifestDoc struct {
	path                              string
	apiVersion, kind, name, namespace string
	yaml                              []byte
}

// manifestDocs splits a file into its documents (comment-only ones dropped).
func manifestDocs(t *testing.T, path string) []manifestDoc {
	t.Helper()
	var docs []manifestDoc
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(read(t, path), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var head struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s doc %d: %v", path, i, err)
		}
		docs = append(docs, manifestDoc{path: path, apiVersion: head.APIVersion, kind: head.Kind,
			name: head.Metadata.Name, namespace: head.Metadata.Namespace, yaml: []byte(doc)})
	}
	return docs
}

// apiResources maps the kinds in the manifests to their REST resources.
var apiResources = map[string]struct {
	plural     string
	namespaced bool
}{
	"v1/Namespace":                       {"namespaces", false},
	"v1/Node":                            {"nodes", false},
	"v1/ResourceQuota":                   {"resourcequotas", true},
	"v1/ServiceAccount":                  {"serviceaccounts", true},
	"v1/Service":                         {"services", true},
	"v1/Pod":                             {"pods", true},
	"batch/v1/Job":                       {"jobs", true},
	"apps/v1/DaemonSet":                  {"daemonsets", true},
	"networking.k8s.io/v1/NetworkPolicy": {"networkpolicies", true},
	"jobset.x-k8s.io/v1alpha2/JobSet":    {"jobsets", true},
	"apiextensions.k8s.io/v1/CustomResourceDefinition": {"customresourcedefinitions", false},
}

// resourcePath is the REST path of an object (name "" for the collection).
func resourcePath(apiVersion, kind, ns, name string) string {
	r, ok := apiResources[apiVersion+"/"+kind]
	if !ok {
		panic("no REST resource known for " + apiVersion + " " + kind)
	}
	p := "/api/v1"
	if strings.Contains(apiVersion, "/") {
		p = "/apis/" + apiVersion
	}
	if r.namespaced {
		p += "/namespaces/" + ns
	}
	p += "/" + r.plural
	if name != "" {
		p += "/" + name
	}
	return p
}

// apply server-side applies a document as written, with strict field
// validation, into ns unless the document names its own namespace.
func (cp *controlPlane) apply(t *testing.T, d manifestDoc, ns string) error {
	t.Helper()
	if d.namespace != "" {
		ns = d.namespace
	}
	path := resourcePath(d.apiVersion, d.kind, ns, d.name) +
		query("fieldManager", "spotagent-deploy-test", "fieldValidation", "Strict", "force", "true")
	if err := cp.do(http.MethodPatch, path, "application/apply-patch+yaml", d.yaml, nil); err != nil {
		return fmt.Errorf("%s %s %s/%s: %w", d.path, d.kind, ns, d.name, err)
	}
	return nil
}

// applyKinds applies the documents of path whose kind is in kinds (all if none).
func (cp *controlPlane) applyKinds(t *testing.T, path, ns string, kinds ...string) []manifestDoc {
	t.Helper()
	var applied []manifestDoc
	for _, d := range manifestDocs(t, path) {
		if len(kinds) > 0 && !contains(kinds, d.kind) {
			continue
		}
		if err := cp.apply(t, d, ns); err != nil {
			t.Fatal(err)
		}
		applied = append(applied, d)
	}
	return applied
}

func randSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// namespace creates a fresh namespace for one test.
func (cp *controlPlane) namespace(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "-" + randSuffix()
	ns := corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cp.do(http.MethodPost, "/api/v1/namespaces", "", ns, nil); err != nil {
		t.Fatal(err)
	}
	return name
}

// node registers a fake Node with the given taints and reports it Ready.
// The tests play its kubelet (the Ready condition) and the node lifecycle
// controller, which lifts the node.kubernetes.io/not-ready taint the
// apiserver's TaintNodesByCondition admission puts on every new Node.
func (cp *controlPlane) node(t *testing.T, name string, labels map[string]string, taints ...corev1.Taint) {
	t.Helper()
	n := corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}
	if err := cp.do(http.MethodPost, "/api/v1/nodes", "", n, nil); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	status := map[string]any{"status": corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}}}
	if err := cp.do(http.MethodPatch, "/api/v1/nodes/"+name+"/status", "application/strategic-merge-patch+json", status, nil); err != nil {
		t.Fatal(err)
	}
	if taints == nil {
		taints = []corev1.Taint{}
	}
	spec := map[string]any{"spec": map[string]any{"taints": taints}}
	if err := cp.do(http.MethodPatch, "/api/v1/nodes/"+name, "application/merge-patch+json", spec, nil); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- kubelet

// jobRun drives one Job's pods: the test is their scheduler and kubelet.
type jobRun struct {
	cp        *controlPlane
	t         *testing.T
	ns, name  string
	node      string
	jobSelect string // label selector of the Job's pods
	seen      map[types.UID]bool
	nodeOf    func(corev1.Pod) string // the node start binds a pod to; nil: node
}

func (cp *controlPlane) newJobRun(t *testing.T, ns, name string) *jobRun {
	node := "node-" + ns
	if err := cp.do(http.MethodGet, "/api/v1/nodes/"+node, "", nil, nil); isNotFound(err) {
		cp.node(t, node, map[string]string{"kubernetes.io/hostname": node})
	} else if err != nil {
		t.Fatal(err)
	}
	return &jobRun{cp: cp, t: t, ns: ns, name: name, node: node,
		jobSelect: "batch.kubernetes.io/job-name=" + name, seen: map[types.UID]bool{}}
}

func (j *jobRun) job() batchv1.Job {
	j.t.Helper()
	var job batchv1.Job
	if err := j.cp.do(http.MethodGet, resourcePath("batch/v1", "Job", j.ns, j.name), "", nil, &job); err != nil {
		j.t.Fatal(err)
	}
	return job
}

func (j *jobRun) pods() []corev1.Pod {
	j.t.Helper()
	var list corev1.PodList
	if err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, "")+query("labelSelector", j.jobSelect), "", nil, &list); err != nil {
		j.t.Fatal(err)
	}
	sort.Slice(list.Items, func(a, b int) bool { return list.Items[a].Name < list.Items[b].Name })
	return list.Items
}

// newPods waits until n pods this run has not seen exist and returns them
// with the moment they were seen (polled every 100 ms). It does not start them.
func (j *jobRun) newPods(n int, timeout time.Duration) ([]corev1.Pod, time.Time) {
	j.t.Helper()
	var fresh []corev1.Pod
	waitFor(j.t, timeout, fmt.Sprintf("%d new pod(s) of job %s/%s", n, j.ns, j.name), func() (bool, error) {
		fresh = fresh[:0]
		for _, p := range j.pods() {
			if !j.seen[p.UID] {
				fresh = append(fresh, p)
			}
		}
		if len(fresh) > n {
			return false, fmt.Errorf("%d new pods, want %d", len(fresh), n)
		}
		return len(fresh) == n, nil
	})
	at := time.Now()
	for _, p := range fresh {
		j.seen[p.UID] = true
	}
	return fresh, at
}

// start plays the scheduler (binding to the run's node) and the kubelet
// (both containers running, the sidecar started).
func (j *jobRun) start(pods ...corev1.Pod) []corev1.Pod {
	j.t.Helper()
	for i, p := range pods {
		b := corev1.Binding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Binding"},
			ObjectMeta: metav1.ObjectMeta{Name: p.Name},
			Target:     corev1.ObjectReference{Kind: "Node", Name: j.node},
		}
		if j.nodeOf != nil {
			b.Target.Name = j.nodeOf(p)
		}
		if err := j.cp.do(http.MethodPost, resourcePath("v1", "Pod", j.ns, p.Name)+"/binding", "", b, nil); err != nil {
			j.t.Fatal(err)
		}
		now := metav1.Now()
		running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		status := corev1.PodStatus{
			Phase:     corev1.PodRunning,
			StartTime: &now,
			HostIP:    "10.0.0.1",
			PodIP:     fmt.Sprintf("10.1.0.%d", i+2),
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
			InitContainerStatuses: statuses(p.Spec.InitContainers, func(name string) corev1.ContainerState {
				if regularInit(p)[name] {
					return completedInit(now)
				}
				return running
			}),
			ContainerStatuses: statuses(p.Spec.Containers, func(string) corev1.ContainerState { return running }),
		}
		pods[i] = j.patchStatus(p, status)
	}
	return pods
}

// regularInit names the pod's init containers that run to completion before
// the others start (the copies directory's setup), as opposed to native
// sidecars (restartPolicy: Always).
func regularInit(p corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy == nil {
			out[c.Name] = true
		}
	}
	return out
}

func completedInit(at metav1.Time) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: at, FinishedAt: at}}
}

func statuses(cs []corev1.Container, state func(name string) corev1.ContainerState) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	started := true
	for _, c := range cs {
		st := state(c.Name)
		out = append(out, corev1.ContainerStatus{Name: c.Name, Image: c.Image, State: st,
			Ready: st.Running != nil, Started: &started})
	}
	return out
}

// patchStatus sends the status as the kubelet does (a strategic merge patch
// of the status subresource: conditions merge by type).
func (j *jobRun) patchStatus(p corev1.Pod, status corev1.PodStatus) corev1.Pod {
	j.t.Helper()
	var out corev1.Pod
	body := map[string]any{"metadata": map[string]any{"uid": p.UID}, "status": status}
	if err := j.cp.do(http.MethodPatch, resourcePath("v1", "Pod", j.ns, p.Name)+"/status",
		"application/strategic-merge-patch+json", body, &out); err != nil {
		j.t.Fatal(err)
	}
	return out
}

// exit plays the kubelet when the pod's containers have ended: each named
// container terminated with its exit code (the sidecar after the trainer),
// the pod Failed unless every code is 0. It returns the finish time the
// kubelet reports (the Job controller's backoff counts from it).
func (j *jobRun) exit(p corev1.Pod, codes map[string]int32) time.Time {
	j.t.Helper()
	now := metav1.Now()
	phase := corev1.PodSucceeded
	state := func(name string) corev1.ContainerState {
		code, ok := codes[name]
		if !ok && regularInit(p)[name] {
			return completedInit(*p.Status.StartTime) // ran to completion before the others started
		}
		if !ok {
			j.t.Fatalf("no exit code for container %s", name)
		}
		if code != 0 {
			phase = corev1.PodFailed
		}
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Reason: reason, StartedAt: *p.Status.StartTime, FinishedAt: now}}
	}
	status := corev1.PodStatus{
		Conditions: []corev1.PodCondition{
			{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now},
		},
		InitContainerStatuses: statuses(p.Spec.InitContainers, state),
		ContainerStatuses:     statuses(p.Spec.Containers, state),
	}
	status.Phase = phase
	j.patchStatus(p, status)
	return now.Time
}

// evict asks the Eviction API to evict the pod, as a drain does.
func (j *jobRun) evict(p corev1.Pod) {
	j.t.Helper()
	ev := map[string]any{"apiVersion": "policy/v1", "kind": "Eviction",
		"metadata": map[string]any{"name": p.Name, "namespace": j.ns}}
	if err := j.cp.do(http.MethodPost, resourcePath("v1", "Pod", j.ns, p.Name)+"/eviction", "", ev, nil); err != nil {
		j.t.Fatal(err)
	}
}

// forget plays the kubelet's final deletion of a terminated pod.
func (j *jobRun) forget(p corev1.Pod) {
	j.t.Helper()
	body := map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
		"preconditions": map[string]any{"uid": p.UID}}
	if err := j.cp.do(http.MethodDelete, resourcePath("v1", "Pod", j.ns, p.Name), "", body, nil); err != nil && !isNotFound(err) {
		j.t.Fatal(err)
	}
}

func condition(job batchv1.Job, typ batchv1.JobConditionType) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// settled waits until the Job controller has accounted for every finished
// pod (no finalizer-tracked pods left uncounted) and returns the Job.
func (j *jobRun) settled() batchv1.Job {
	j.t.Helper()
	var job batchv1.Job
	waitFor(j.t, 30*time.Second, "job "+j.name+" to account for its finished pods", func() (bool, error) {
		job = j.job()
		u := job.Status.UncountedTerminatedPods
		return u == nil || len(u.Failed)+len(u.Succeeded) == 0, nil
	})
	return job
}

func (j *jobRun) wantRunning(failed int32) batchv1.Job {
	j.t.Helper()
	job := j.settled()
	if job.Status.Failed != failed {
		j.t.Errorf("job status.failed = %d, want %d", job.Status.Failed, failed)
	}
	for _, c := range []batchv1.JobConditionType{batchv1.JobFailed, batchv1.JobComplete, batchv1.JobFailureTarget} {
		if cond := condition(job, c); cond != nil {
			j.t.Errorf("job has condition %s (%s: %s)", c, cond.Reason, cond.Message)
		}
	}
	return job
}

// ---------------------------------------------------------------- the tests

// TestK8sManifestsApply: every document in kubernetes/ is accepted by a
// real kube-apiserver with strict server-side field validation, and that
// validation is on (an unknown field is refused).
func TestK8sManifestsApply(t *testing.T) {
	t.Parallel()
	cp := sharedControlPlane(t)
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	n := 0
	for _, f := range files {
		// One namespace per file (TestK8sManifestsApplyTogether applies them into one).
		ns := cp.namespace(t, "apply")
		for _, d := range manifestDocs(t, f) {
			if d.kind == "JobSet" {
				continue // its CRD: TestK8sJobSet
			}
			if err := cp.apply(t, d, ns); err != nil {
				t.Error(err)
			}
			n++
		}
	}
	t.Logf("%d documents from %d files applied", n, len(files))
	ns := cp.namespace(t, "strict")

	var bad manifestDoc
	for _, d := range manifestDocs(t, "kubernetes/sidecar-job.yaml") {
		if d.kind == "Job" {
			bad = d
		}
	}
	bad.yaml = []byte(strings.Replace(string(bad.yaml), "name: "+bad.name, "name: strict-check", 1))
	bad.name = "strict-check"
	bad.yaml = []byte(strings.Replace(string(bad.yaml), "backoffLimit:", "backofLimit:", 1))
	if err := cp.apply(t, bad, ns); err == nil || !strings.Contains(err.Error(), "backofLimit") {
		t.Errorf("an unknown field was not refused by strict validation: %v", err)
	}
}

// jobSetCRDVersion is the JobSet release whose CRD the shipped JobSet is
// applied against when SPOTAGENT_JOBSET_CRD does not name one: the module
// proxy serves the repository, CRD included.
const jobSetCRDVersion = "v0.11.1"

// jobSetCRD returns the path of the JobSet CRD: SPOTAGENT_JOBSET_CRD, else
// the one in sigs.k8s.io/jobset@jobSetCRDVersion from the module proxy.
func jobSetCRD(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SPOTAGENT_JOBSET_CRD"); p != "" {
		return p
	}
	out, err := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/jobset@"+jobSetCRDVersion).Output()
	if err != nil {
		t.Fatalf("go mod download sigs.k8s.io/jobset@%s: %v", jobSetCRDVersion, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download sigs.k8s.io/jobset: %v %s", err, out)
	}
	return filepath.Join(m.Dir, "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml")
}

// TestK8sManifestsApplyTogether (#45): the shipped manifests applied all
// together into one namespace, as `kubectl apply -f deploy/kubernetes/`
// does: no two documents name the same object, and the real apiserver
// accepts every one (server-side, strict), the JobSet against its CRD.
func TestK8sManifestsApplyTogether(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var docs []manifestDoc
	seen := map[string]string{}
	for _, f := range files {
		for _, d := range manifestDocs(t, f) {
			key := d.apiVersion + " " + d.kind + " " + d.namespace + "/" + d.name
			if prev, ok := seen[key]; ok {
				t.Errorf("%s and %s both define %s", prev, f, key)
			}
			seen[key] = f
			docs = append(docs, d)
		}
	}
	cp := sharedControlPlane(t)
	for _, d := range manifestDocs(t, jobSetCRD(t)) {
		if err := cp.apply(t, d, ""); err != nil {
			t.Fatal(err)
		}
	}
	ns := cp.namespace(t, "together")
	for _, d := range docs {
		if d.kind != "JobSet" {
			if err := cp.apply(t, d, ns); err != nil {
				t.Error(err)
			}
			continue
		}
		// The discovery of a new CRD lags its Established condition a little.
		waitFor(t, 60*time.Second, "the JobSet applied", func() (bool, error) {
			err := cp.apply(t, d, ns)
			if isNotFound(err) {
				return false, nil
			}
			return err == nil, err
		})
	}
	t.Logf("%d documents from %d files applied into one namespace", len(docs), len(files))
}

// sidecarJob applies sidecar-job.yaml (the Job and the ServiceAccount it uses) into
// a fresh namespace and returns its run with the first pod started.
func sidecarJob(t *testing.T, prefix string) (*jobRun, corev1.Pod) {
	cp := sharedControlPlane(t)
	ns := cp.namespace(t, prefix)
	cp.applyKinds(t, "kubernetes/sidecar-job.yaml", ns, "ServiceAccount")
	job := cp.applyKinds(t, "kubernetes/sidecar-job.yaml", ns, "Job")[0]
	j := cp.newJobRun(t, ns, job.name)
	pods, _ := j.newPods(1, 30*time.Second)
	return j, j.start(pods...)[0]
}

// replaced waits for the replacement of a pod that finished at finished and
// returns it started, with the delay.
func (j *jobRun) replaced(finished time.Time, timeout time.Duration) (corev1.Pod, time.Duration) {
	j.t.Helper()
	pods, at := j.newPods(1, timeout)
	return j.start(pods...)[0], at.Sub(finished)
}

// TestK8sSidecarJobExitPaths: what the real Job controller does with
// sidecar-job.yaml's pods for each way a pod ends (deploy/README.md).
func TestK8sSidecarJobExitPaths(t *testing.T) {
	t.Parallel()
	t.Run("trainer75", func(t *testing.T) {
		t.Parallel()
		j, p := sidecarJob(t, "exit75")
		finished := j.exit(p, map[string]int32{"trainer": 75, "spotagent": 0})
		_, delay := j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(0)
		t.Logf("trainer 75: replacement after %s", delay.Round(100*time.Millisecond))
	})
	t.Run("eviction", func(t *testing.T) {
		t.Parallel()
		j, p := sidecarJob(t, "evict")
		j.evict(p)
		// The pod is terminating (grace period 110 s): no replacement while
		// it runs. The sync that counts it as terminating creates none.
		waitFor(t, 30*time.Second, "job to count the evicted pod as terminating", func() (bool, error) {
			job := j.job()
			return job.Status.Terminating != nil && *job.Status.Terminating == 1, nil
		})
		if pods := j.pods(); len(pods) != 1 {
			t.Fatalf("%d pods while the evicted one terminates, want 1 (podReplacementPolicy: Failed)", len(pods))
		}
		var evicted corev1.Pod
		if err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, p.Name), "", nil, &evicted); err != nil {
			t.Fatal(err)
		}
		dt := false
		for _, c := range evicted.Status.Conditions {
			dt = dt || (c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue)
		}
		if !dt || evicted.DeletionTimestamp == nil {
			t.Fatalf("evicted pod: DisruptionTarget %v, deletionTimestamp %v", dt, evicted.DeletionTimestamp)
		}
		// The trainer takes its final checkpoint on SIGTERM and exits 75;
		// the sidecar then gets SIGTERM and exits 0; the kubelet deletes it.
		finished := j.exit(evicted, map[string]int32{"trainer": 75, "spotagent": 0})
		j.forget(evicted)
		_, delay := j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(0)
		t.Logf("eviction: replacement %s after the pod terminated", delay.Round(100*time.Millisecond))
	})
	t.Run("evictionSIGKILL", func(t *testing.T) {
		// Killed at the end of the grace period (137): the DisruptionTarget
		// condition alone keeps it from counting.
		t.Parallel()
		j, p := sidecarJob(t, "evict137")
		j.evict(p)
		waitFor(t, 30*time.Second, "eviction", func() (bool, error) {
			job := j.job()
			return job.Status.Terminating != nil && *job.Status.Terminating == 1, nil
		})
		var evicted corev1.Pod
		if err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, p.Name), "", nil, &evicted); err != nil {
			t.Fatal(err)
		}
		finished := j.exit(evicted, map[string]int32{"trainer": 137, "spotagent": 137})
		j.forget(evicted)
		j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(0)
	})
	t.Run("crash", func(t *testing.T) {
		t.Parallel()
		j, p := sidecarJob(t, "exit1")
		finished := j.exit(p, map[string]int32{"trainer": 1, "spotagent": 0})
		j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(1)
	})
	t.Run("success", func(t *testing.T) {
		t.Parallel()
		j, p := sidecarJob(t, "exit0")
		j.exit(p, map[string]int32{"trainer": 0, "spotagent": 0})
		waitFor(t, 30*time.Second, "job Complete", func() (bool, error) {
			return condition(j.job(), batchv1.JobComplete) != nil, nil
		})
		if job := j.job(); job.Status.Succeeded != 1 || job.Status.Failed != 0 {
			t.Errorf("succeeded %d failed %d, want 1 0", job.Status.Succeeded, job.Status.Failed)
		}
		if pods := j.pods(); len(pods) != 1 {
			t.Errorf("%d pods after completion, want 1", len(pods))
		}
	})
	t.Run("sidecar75trainer1", func(t *testing.T) {
		// The rule names the trainer: the sidecar's 75 does not excuse a crash.
		t.Parallel()
		j, p := sidecarJob(t, "side75")
		finished := j.exit(p, map[string]int32{"trainer": 1, "spotagent": 75})
		j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(1)
	})
	t.Run("fourthCrashFails", func(t *testing.T) {
		// backoffLimit 3: the fourth crash fails the Job (after backoffs of
		// 10, 20 and 40 s).
		t.Parallel()
		j, p := sidecarJob(t, "crash4")
		for crash := 1; crash <= 3; crash++ {
			finished := j.exit(p, map[string]int32{"trainer": 1, "spotagent": 0})
			var delay time.Duration
			p, delay = j.replaced(finished, jobBackoff<<(crash-1)+30*time.Second)
			j.wantRunning(int32(crash))
			t.Logf("crash %d: replacement after %s", crash, delay.Round(100*time.Millisecond))
		}
		j.exit(p, map[string]int32{"trainer": 1, "spotagent": 0})
		var job batchv1.Job
		waitFor(t, 30*time.Second, "job Failed", func() (bool, error) {
			job = j.job()
			return condition(job, batchv1.JobFailed) != nil, nil
		})
		if c := condition(job, batchv1.JobFailed); c.Reason != "BackoffLimitExceeded" || job.Status.Failed != 4 {
			t.Errorf("job failed with %s, status.failed %d; want BackoffLimitExceeded, 4", c.Reason, job.Status.Failed)
		}
		if pods := j.pods(); len(pods) != 4 {
			t.Errorf("%d pods, want 4 (no fifth)", len(pods))
		}
	})
	t.Run("nodeVanished", func(t *testing.T) {
		// The cloud deletes the Node of a reclaimed VM without any notice
		// (no drain): pod GC fails its pods with DisruptionTarget
		// (DeletionByPodGC) after its 40 s quarantine; not counted.
		t.Parallel()
		j, _ := sidecarJob(t, "vanish")
		gone := time.Now()
		if err := j.cp.do(http.MethodDelete, "/api/v1/nodes/"+j.node, "", nil, nil); err != nil {
			t.Fatal(err)
		}
		j.node = "node2-" + j.ns
		j.cp.node(t, j.node, nil)
		_, delay := j.replaced(gone, 150*time.Second)
		j.wantRunning(0)
		t.Logf("node deleted: replacement after %s", delay.Round(100*time.Millisecond))
	})
}

// TestK8sNodeTrainerJob: node-trainer-job.yaml's trainer exit 75 is
// replaced without counting, a crash counts.
func TestK8sNodeTrainerJob(t *testing.T) {
	t.Parallel()
	cp := sharedControlPlane(t)
	ns := cp.namespace(t, "nodejob")
	cp.applyKinds(t, "kubernetes/node-trainer-job.yaml", ns, "ServiceAccount")
	job := cp.applyKinds(t, "kubernetes/node-trainer-job.yaml", ns, "Job")[0]
	j := cp.newJobRun(t, ns, job.name)
	pods, _ := j.newPods(1, 30*time.Second)
	p := j.start(pods...)[0]
	codes := map[string]int32{}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		codes[c.Name] = 0
	}
	codes["trainer"] = 75
	finished := j.exit(p, codes)
	p, _ = j.replaced(finished, 2*jobBackoff+10*time.Second)
	j.wantRunning(0)
	codes["trainer"] = 1
	finished = j.exit(p, codes)
	j.replaced(finished, 3*jobBackoff+10*time.Second)
	j.wantRunning(1)
}

// multinodeJob applies multinode-job.yaml into a fresh namespace and
// returns its run with both pods started, sorted by completion index.
func multinodeJob(t *testing.T, prefix string) (*jobRun, []corev1.Pod) {
	cp := sharedControlPlane(t)
	ns := cp.namespace(t, prefix)
	var name string
	for _, d := range cp.applyKinds(t, "kubernetes/multinode-job.yaml", ns) {
		if d.kind == "Job" {
			name = d.name
		}
	}
	j := cp.newJobRun(t, ns, name)
	pods, _ := j.newPods(2, 30*time.Second)
	pods = j.start(pods...)
	sort.Slice(pods, func(a, b int) bool { return completionIndex(pods[a]) < completionIndex(pods[b]) })
	if completionIndex(pods[0]) != "0" || completionIndex(pods[1]) != "1" {
		t.Fatalf("completion indexes %s, %s", completionIndex(pods[0]), completionIndex(pods[1]))
	}
	return j, pods
}

func completionIndex(p corev1.Pod) string { return p.Annotations[batchv1.JobCompletionIndexAnnotation] }

var multinodeCodes = func(trainer int32) map[string]int32 {
	return map[string]int32{"trainer": trainer, "spotagent": 0}
}

// TestK8sMultinodeJob: the Indexed Job replaces each pod whose trainer
// exits 75 on its own; it does not restart the other ranks (a whole-job
// restart needs every rank to exit 75, which the agent's stop does).
func TestK8sMultinodeJob(t *testing.T) {
	t.Parallel()
	t.Run("bothExit75", func(t *testing.T) {
		t.Parallel()
		j, pods := multinodeJob(t, "multi75")
		finished := j.exit(pods[0], multinodeCodes(75))
		j.exit(pods[1], multinodeCodes(75))
		fresh, at := j.newPods(2, 3*jobBackoff+10*time.Second)
		sort.Slice(fresh, func(a, b int) bool { return completionIndex(fresh[a]) < completionIndex(fresh[b]) })
		if completionIndex(fresh[0]) != "0" || completionIndex(fresh[1]) != "1" {
			t.Errorf("replacements have indexes %s, %s", completionIndex(fresh[0]), completionIndex(fresh[1]))
		}
		j.start(fresh...)
		j.wantRunning(0)
		t.Logf("both ranks 75: replacements after %s", at.Sub(finished).Round(100*time.Millisecond))
	})
	t.Run("oneExit75", func(t *testing.T) {
		t.Parallel()
		j, pods := multinodeJob(t, "multi1of2")
		finished := j.exit(pods[1], multinodeCodes(75))
		fresh, _ := j.replaced(finished, 2*jobBackoff+10*time.Second)
		if completionIndex(fresh) != "1" {
			t.Errorf("replacement has index %s, want 1", completionIndex(fresh))
		}
		var rank0 corev1.Pod
		if err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, pods[0].Name), "", nil, &rank0); err != nil {
			t.Fatal(err)
		}
		if rank0.DeletionTimestamp != nil || rank0.Status.Phase != corev1.PodRunning {
			t.Errorf("rank 0 was touched: phase %s, deleting %v", rank0.Status.Phase, rank0.DeletionTimestamp)
		}
		j.wantRunning(0)
	})
	t.Run("rankCrash", func(t *testing.T) {
		t.Parallel()
		j, pods := multinodeJob(t, "multicrash")
		finished := j.exit(pods[1], multinodeCodes(1))
		j.replaced(finished, 2*jobBackoff+10*time.Second)
		j.wantRunning(1)
	})
}

// TestK8sDaemonSet: the DaemonSet controller places the node agent on spot
// nodes of every cloud, tainted or not, and on no other node.
func TestK8sDaemonSet(t *testing.T) {
	t.Parallel()
	cp := sharedControlPlane(t)
	sfx := randSuffix()
	gpu := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	nodes := []struct {
		name   string
		labels map[string]string
		taints []corev1.Taint
		spot   bool
	}{
		{"eks-spot", map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}, nil, true},
		{"eks-spot-gpu", map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}, []corev1.Taint{gpu}, true},
		{"eks-ondemand", map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"}, nil, false},
		{"karpenter-spot", map[string]string{"karpenter.sh/capacity-type": "spot"}, nil, true},
		{"karpenter-ondemand", map[string]string{"karpenter.sh/capacity-type": "on-demand"}, nil, false},
		{"gke-spot", map[string]string{"cloud.google.com/gke-spot": "true"},
			[]corev1.Taint{{Key: "cloud.google.com/gke-spot", Value: "true", Effect: corev1.TaintEffectNoSchedule}}, true},
		{"gke-preemptible", map[string]string{"cloud.google.com/gke-preemptible": "true"},
			[]corev1.Taint{{Key: "cloud.google.com/gke-preemptible", Value: "true", Effect: corev1.TaintEffectNoSchedule}}, true},
		{"aks-spot", map[string]string{"kubernetes.azure.com/scalesetpriority": "spot"},
			[]corev1.Taint{{Key: "kubernetes.azure.com/scalesetpriority", Value: "spot", Effect: corev1.TaintEffectNoSchedule}}, true},
		{"aks-regular", map[string]string{"kubernetes.azure.com/scalesetpriority": "regular"}, nil, false},
		{"plain-gpu", nil, []corev1.Taint{gpu}, false},
	}
	want := map[string]bool{}
	for _, n := range nodes {
		name := "ds-" + n.name + "-" + sfx
		cp.node(t, name, n.labels, n.taints...)
		if n.spot {
			want[name] = true
		}
	}
	var ds manifestDoc
	for _, d := range cp.applyKinds(t, "kubernetes/daemonset.yaml", "") {
		if d.kind == "DaemonSet" {
			ds = d
		}
	}
	// Other tests' nodes carry no spot label: every spot node is one of ours.
	got := map[string]bool{}
	waitFor(t, 60*time.Second, "a DaemonSet pod for each spot node", func() (bool, error) {
		var d appsv1.DaemonSet
		if err := cp.do(http.MethodGet, resourcePath("apps/v1", "DaemonSet", ds.namespace, ds.name), "", nil, &d); err != nil {
			return false, err
		}
		var list corev1.PodList
		if err := cp.do(http.MethodGet, resourcePath("v1", "Pod", ds.namespace, "")+query("labelSelector", "app.kubernetes.io/component=node-agent"), "", nil, &list); err != nil {
			return false, err
		}
		got = map[string]bool{}
		for _, p := range list.Items {
			got[daemonPodNode(p)] = true
		}
		return d.Status.ObservedGeneration == d.Generation && int(d.Status.DesiredNumberScheduled) == len(want) && len(list.Items) == len(want), nil
	})
	for n := range want {
		if !got[n] {
			t.Errorf("no node agent on spot node %s", n)
		}
	}
	for n := range got {
		if !want[n] {
			t.Errorf("node agent on %s, which is not a spot node", n)
		}
	}
}

// daemonPodNode is the node a DaemonSet pod is pinned to (the controller
// sets a required node affinity on metadata.name; the scheduler binds it).
func daemonPodNode(p corev1.Pod) string {
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range term.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return p.Spec.NodeName
}
