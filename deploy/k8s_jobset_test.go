package deploy

// multinode-jobset.yaml. Without the JobSet controller (TestK8sJobSetController
// and k8s_copies_test.go run the real one when scripts/controllers-build.sh
// has built it), what runs here is:
//   - the JobSet read into the v1alpha2 fields it uses, strictly (an
//     unknown or misspelt field fails), with the enums of the JobSet API;
//   - its child Job, built as the JobSet controller builds it, created in
//     the real apiserver and driven through the real Job controller: the
//     Job must fail at once with the reason the JobSet's failure policy
//     rules match for each exit path;
//   - with the controllers built (or SPOTAGENT_JOBSET_CRD naming a JobSet
//     CRD), the CRD is installed and the JobSet applied as written: the
//     apiserver validates it against the CRD's schema and CEL rules.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const jobSetPath = "kubernetes/multinode-jobset.yaml"

// jobSet holds the fields of jobset.x-k8s.io/v1alpha2 JobSet the shipped
// manifest uses (api/jobset/v1alpha2/jobset_types.go); decoding strictly
// into it refuses anything else.
type jobSet struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Network *struct {
			EnableDNSHostnames       *bool  `json:"enableDNSHostnames,omitempty"`
			Subdomain                string `json:"subdomain,omitempty"`
			PublishNotReadyAddresses *bool  `json:"publishNotReadyAddresses,omitempty"`
		} `json:"network,omitempty"`
		FailurePolicy *struct {
			MaxRestarts     int32  `json:"maxRestarts,omitempty"`
			RestartStrategy string `json:"restartStrategy,omitempty"`
			Rules           []struct {
				Name                        string   `json:"name"`
				Action                      string   `json:"action"`
				OnJobFailureReasons         []string `json:"onJobFailureReasons,omitempty"`
				OnJobFailureMessagePatterns []string `json:"onJobFailureMessagePatterns,omitempty"`
				TargetReplicatedJobs        []string `json:"targetReplicatedJobs,omitempty"`
			} `json:"rules,omitempty"`
		} `json:"failurePolicy,omitempty"`
		ReplicatedJobs []struct {
			Name     string                  `json:"name"`
			Replicas *int32                  `json:"replicas,omitempty"`
			Template batchv1.JobTemplateSpec `json:"template"`
		} `json:"replicatedJobs"`
	} `json:"spec"`
}

func readJobSet(t *testing.T) (*jobSet, manifestDoc) {
	t.Helper()
	var docs []manifestDoc // the JobSet; its NetworkPolicy and ServiceAccount are not this test's
	for _, d := range manifestDocs(t, jobSetPath) {
		if d.kind != "NetworkPolicy" && d.kind != "ServiceAccount" {
			docs = append(docs, d)
		}
	}
	if len(docs) != 1 || docs[0].kind != "JobSet" || docs[0].apiVersion != "jobset.x-k8s.io/v1alpha2" {
		t.Fatalf("%s: want one jobset.x-k8s.io/v1alpha2 JobSet", jobSetPath)
	}
	var js jobSet
	if err := yaml.UnmarshalStrict(docs[0].yaml, &js); err != nil {
		t.Fatalf("%s: strict decode: %v", jobSetPath, err)
	}
	return &js, docs[0]
}

// checkJobSet: the failure policy restarts the set, uncounted, on exactly
// the reason the child Job's podFailurePolicy produces (PodFailurePolicy),
// and counts everything else; the child Job fails on the first exit 75,
// disruption or crash; rank 0's address is the name JobSet gives its pod.
func checkJobSet(t *testing.T, js *jobSet) (rule string) {
	t.Helper()
	fp := js.Spec.FailurePolicy
	if fp == nil {
		t.Fatal("no failurePolicy: the JobSet would fail on the first interruption")
	}
	if fp.MaxRestarts < 1 || fp.MaxRestarts > 10 {
		t.Errorf("maxRestarts %d: want a small number (crashes only)", fp.MaxRestarts)
	}
	if fp.RestartStrategy != "BlockingRecreate" {
		t.Errorf("restartStrategy %q: want BlockingRecreate (no two pods of one run at once)", fp.RestartStrategy)
	}
	actions := []string{"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob", "RestartJobAndIgnoreMaxRestarts"}
	uncounted := 0
	for _, r := range fp.Rules {
		if !contains(actions, r.Action) {
			t.Errorf("rule %q: action %q is not one of %v", r.Name, r.Action, actions)
		}
		if r.Action == "RestartJobSetAndIgnoreMaxRestarts" && len(r.OnJobFailureReasons) == 1 &&
			r.OnJobFailureReasons[0] == "PodFailurePolicy" && len(r.OnJobFailureMessagePatterns) == 0 {
			uncounted++
			rule = r.Name
		} else if r.Action != "RestartJobSet" {
			t.Errorf("rule %q (%s on %v): only interruptions may restart uncounted", r.Name, r.Action, r.OnJobFailureReasons)
		}
	}
	if uncounted != 1 {
		t.Errorf("want one rule RestartJobSetAndIgnoreMaxRestarts on [PodFailurePolicy], found %d", uncounted)
	}
	if len(js.Spec.ReplicatedJobs) != 1 {
		t.Fatalf("%d replicatedJobs, want 1", len(js.Spec.ReplicatedJobs))
	}
	rj := js.Spec.ReplicatedJobs[0]
	if rj.Replicas == nil || *rj.Replicas != 1 {
		t.Errorf("replicas %v: want 1 (the node rank is the completion index of one Indexed Job)", rj.Replicas)
	}
	job := rj.Template.Spec
	if job.BackoffLimit == nil || *job.BackoffLimit != 0 {
		t.Errorf("child backoffLimit %v: want 0 (the JobSet counts crashes, the Job's backoff would delay restarts)", job.BackoffLimit)
	}
	failJob := map[string]bool{}
	if job.PodFailurePolicy != nil {
		for _, r := range job.PodFailurePolicy.Rules {
			if r.Action != batchv1.PodFailurePolicyActionFailJob {
				t.Errorf("child podFailurePolicy rule %s: only FailJob (Ignore would bring back the Job's backoff)", r.Action)
				continue
			}
			for _, c := range r.OnPodConditions {
				if c.Type == corev1.DisruptionTarget {
					failJob["DisruptionTarget"] = true
				}
			}
			if e := r.OnExitCodes; e != nil && e.ContainerName != nil && *e.ContainerName == "trainer" &&
				e.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && len(e.Values) == 1 && e.Values[0] == 75 {
				failJob["75"] = true
			}
		}
	}
	if !failJob["DisruptionTarget"] || !failJob["75"] {
		t.Errorf("child podFailurePolicy must FailJob on DisruptionTarget and on trainer exit 75: %v", failJob)
	}
	spec := job.Template.Spec
	checkSidecarPodSpec(t, spec)
	checkSpotTolerations(t, spec)
	sub := js.Metadata.Name
	if n := js.Spec.Network; n != nil && n.Subdomain != "" {
		sub = n.Subdomain
	}
	rank0 := fmt.Sprintf("%s-%s-0-0.%s", js.Metadata.Name, rj.Name, sub)
	for _, c := range spec.Containers {
		if c.Name == "trainer" && !strings.Contains(strings.Join(c.Command, " "), "--master_addr="+rank0+" ") {
			t.Errorf("trainer command: rank 0 is %s", rank0)
		}
	}
	for _, c := range spec.InitContainers {
		if c.Name == "spotagent" {
			ok := false
			for _, e := range c.Env {
				ok = ok || (e.Name == "SPOTAGENT_RUN_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
					e.ValueFrom.FieldRef.FieldPath == "metadata.labels['jobset.sigs.k8s.io/jobset-name']")
			}
			if !ok {
				t.Error("SPOTAGENT_RUN_ID: want the JobSet's name label (the child Jobs are recreated)")
			}
		}
	}
	checkSameAsMultinodeJob(t, js, rank0)
	return rule
}

// checkSameAsMultinodeJob: the JobSet's pods are multinode-job.yaml's but
// for what a JobSet names differently (rank 0's address, the run id's
// label, the subdomain the JobSet sets), so the two cannot drift apart.
func checkSameAsMultinodeJob(t *testing.T, js *jobSet, rank0 string) {
	t.Helper()
	job := only[*batchv1.Job](t, decodeManifests(t, "kubernetes/multinode-job.yaml"))
	want := job.Spec.Template.Spec.DeepCopy()
	got := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.DeepCopy()
	got.Subdomain = want.Subdomain
	for _, cs := range [][]corev1.Container{got.InitContainers, got.Containers} {
		for i := range cs {
			c := &cs[i]
			for k, a := range c.Command {
				c.Command[k] = strings.Replace(a, "--master_addr="+rank0, "--master_addr="+job.Name+"-0."+want.Subdomain, 1)
			}
			for k := range c.Env {
				if f := c.Env[k].ValueFrom; f != nil && f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.labels['jobset.sigs.k8s.io/jobset-name']" {
					f.FieldRef.FieldPath = "metadata.labels['batch.kubernetes.io/job-name']"
				}
			}
		}
	}
	// The two files are two runs (their names must not clash): the JobSet's
	// run id stands where the Job's does (store, copies, config).
	g, _ := yaml.Marshal(got)
	w, _ := yaml.Marshal(want)
	g = []byte(strings.ReplaceAll(string(g), js.Metadata.Name, job.Name))
	if string(g) != string(w) {
		t.Errorf("the JobSet's pod spec differs from multinode-job.yaml's beyond the JobSet names:\n--- jobset\n%s\n--- job\n%s", g, w)
	}
	if js.Spec.ReplicatedJobs[0].Template.Spec.Completions == nil || *js.Spec.ReplicatedJobs[0].Template.Spec.Completions != *job.Spec.Completions {
		t.Error("the JobSet's node count differs from multinode-job.yaml's")
	}
}

// childJob is the Job the JobSet controller creates for replicated job rj,
// index 0: named <jobset>-<rj>-0, labelled, its pods in the subdomain.
func childJob(js *jobSet) batchv1.Job {
	rj := js.Spec.ReplicatedJobs[0]
	name := fmt.Sprintf("%s-%s-0", js.Metadata.Name, rj.Name)
	labels := map[string]string{
		"jobset.sigs.k8s.io/jobset-name":        js.Metadata.Name,
		"jobset.sigs.k8s.io/replicatedjob-name": rj.Name,
		"jobset.sigs.k8s.io/job-index":          "0",
		"jobset.sigs.k8s.io/restart-attempt":    "0",
	}
	job := batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       *rj.Template.Spec.DeepCopy(),
	}
	if job.Spec.Template.Labels == nil {
		job.Spec.Template.Labels = map[string]string{}
	}
	for k, v := range labels {
		job.Spec.Template.Labels[k] = v
	}
	job.Spec.Template.Spec.Subdomain = js.Metadata.Name
	if n := js.Spec.Network; n != nil && n.Subdomain != "" {
		job.Spec.Template.Spec.Subdomain = n.Subdomain
	}
	return job
}

// jobSetChild creates the child Job in a fresh namespace and starts its pods.
func jobSetChild(t *testing.T, prefix string) (*jobRun, []corev1.Pod) {
	t.Helper()
	cp := sharedControlPlane(t)
	js, _ := readJobSet(t)
	ns := cp.namespace(t, prefix)
	cp.applyKinds(t, jobSetPath, ns, "ServiceAccount")
	job := childJob(js)
	if err := cp.do(http.MethodPost, resourcePath("batch/v1", "Job", ns, "")+query("fieldValidation", "Strict"), "", job, nil); err != nil {
		t.Fatal(err)
	}
	j := cp.newJobRun(t, ns, job.Name)
	pods, _ := j.newPods(int(*job.Spec.Parallelism), 30*time.Second)
	pods = j.start(pods...)
	return j, pods
}

// fails waits for the Job controller's decision to fail the Job (its
// FailureTarget condition), plays the kubelet for the pods it then
// terminates (SIGTERM: the trainer exits 143), and waits for the Failed
// condition the JobSet controller acts on, once every pod has terminated.
// It returns Failed's reason and the time from since to the decision.
func (j *jobRun) fails(since time.Time) (string, time.Duration) {
	j.t.Helper()
	var target *batchv1.JobCondition
	waitFor(j.t, 30*time.Second, "job FailureTarget", func() (bool, error) {
		job := j.job()
		target = condition(job, batchv1.JobFailureTarget)
		if target == nil {
			target = condition(job, batchv1.JobFailed)
		}
		return target != nil, nil
	})
	decided := time.Since(since)
	var failed *batchv1.JobCondition
	waitFor(j.t, 30*time.Second, "job Failed", func() (bool, error) {
		for _, p := range j.pods() {
			if p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodRunning {
				j.exit(p, multinodeCodes(143))
				j.forget(p)
			}
		}
		failed = condition(j.job(), batchv1.JobFailed)
		return failed != nil, nil
	})
	if failed.Reason != target.Reason {
		j.t.Errorf("FailureTarget %s, Failed %s", target.Reason, failed.Reason)
	}
	return failed.Reason, decided
}

func TestK8sJobSet(t *testing.T) {
	t.Parallel()
	js, doc := readJobSet(t)
	rule := checkJobSet(t, js)

	t.Run("crd", func(t *testing.T) {
		t.Parallel()
		crd := os.Getenv("SPOTAGENT_JOBSET_CRD")
		var cp *controlPlane
		if crd == "" {
			// The CRD as the controllers' build copied it, with the real
			// controller running (k8s_trainer_test.go).
			needControllers(t)
			cp = runJobSetController(t)
		} else {
			cp = sharedControlPlane(t)
			for _, d := range manifestDocs(t, crd) {
				if err := cp.apply(t, d, ""); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitFor(t, 30*time.Second, "the JobSet CRD established", func() (bool, error) {
			var c struct {
				Status struct{ Conditions []metav1.Condition }
			}
			if err := cp.do(http.MethodGet, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io", "", nil, &c); err != nil {
				return false, err
			}
			for _, cond := range c.Status.Conditions {
				if cond.Type == "Established" && cond.Status == metav1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		ns := cp.namespace(t, "jobset")
		// The discovery of a new CRD lags its Established condition a little.
		waitFor(t, 30*time.Second, "the JobSet applied", func() (bool, error) {
			err := cp.apply(t, doc, ns)
			if isNotFound(err) {
				return false, nil
			}
			return err == nil, err
		})
		bad := doc
		bad.yaml = []byte(strings.Replace(string(doc.yaml), "restartStrategy: BlockingRecreate", "restartStrategy: Blocking", 1))
		if err := cp.apply(t, bad, ns); err == nil {
			t.Error("the CRD accepted restartStrategy: Blocking")
		}
	})
	t.Run("trainer75", func(t *testing.T) {
		// One rank's 75 fails the child Job at once, reason
		// PodFailurePolicy, and the other rank's pod is terminated: the
		// JobSet restarts the whole set, uncounted.
		t.Parallel()
		j, pods := jobSetChild(t, "js75")
		finished := j.exit(pods[1], multinodeCodes(75))
		reason, after := j.fails(finished)
		if reason != "PodFailurePolicy" {
			t.Errorf("child Job failed with %s, want PodFailurePolicy (rule %q)", reason, rule)
		}
		var rank0 corev1.Pod
		err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, pods[0].Name), "", nil, &rank0)
		if err == nil && rank0.Status.Phase == corev1.PodRunning {
			t.Errorf("rank 0 still running after the child Job failed")
		}
		t.Logf("rank 1 exit 75: child Job failing (%s) after %s", reason, after.Round(100*time.Millisecond))
	})
	t.Run("disruption", func(t *testing.T) {
		t.Parallel()
		j, pods := jobSetChild(t, "jsevict")
		j.evict(pods[0])
		var evicted corev1.Pod
		if err := j.cp.do(http.MethodGet, resourcePath("v1", "Pod", j.ns, pods[0].Name), "", nil, &evicted); err != nil {
			t.Fatal(err)
		}
		finished := j.exit(evicted, multinodeCodes(137))
		j.forget(evicted)
		if reason, _ := j.fails(finished); reason != "PodFailurePolicy" {
			t.Errorf("child Job failed with %s, want PodFailurePolicy (rule %q)", reason, rule)
		}
	})
	t.Run("crash", func(t *testing.T) {
		// A crash fails the child Job with BackoffLimitExceeded: no rule
		// matches, the default RestartJobSet counts against maxRestarts.
		t.Parallel()
		j, pods := jobSetChild(t, "jscrash")
		finished := j.exit(pods[0], multinodeCodes(1))
		if reason, _ := j.fails(finished); reason != "BackoffLimitExceeded" {
			t.Errorf("child Job failed with %s, want BackoffLimitExceeded (counted)", reason)
		}
	})
	t.Run("success", func(t *testing.T) {
		t.Parallel()
		j, pods := jobSetChild(t, "jsdone")
		j.exit(pods[0], multinodeCodes(0))
		j.exit(pods[1], multinodeCodes(0))
		waitFor(t, 30*time.Second, "child Job Complete", func() (bool, error) {
			return condition(j.job(), batchv1.JobComplete) != nil, nil
		})
	})
}

// TestK8sJobSetController runs the real JobSet controller (built by
// scripts/controllers-build.sh, k8s_trainer_test.go) against
// multinode-jobset.yaml as written: n interruptions (one rank exits 75)
// restart the whole set, uncounted, and the delay from the exit to the new
// set's pods is measured; then a crash counts. SPOTAGENT_K8S_DELAYS=8 for
// more interruptions than 2.
func TestK8sJobSetController(t *testing.T) {
	needControllers(t)
	t.Parallel()
	n, _ := strconv.Atoi(os.Getenv("SPOTAGENT_K8S_DELAYS"))
	n = max(n, 2)
	cp := runJobSetController(t)
	js, doc := readJobSet(t)
	ns := cp.namespace(t, "jsctl")
	cp.applyKinds(t, jobSetPath, ns, "ServiceAccount")
	waitFor(t, 30*time.Second, "the JobSet applied", func() (bool, error) {
		err := cp.apply(t, doc, ns)
		if isNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	j := cp.newJobRun(t, ns, js.Metadata.Name)
	j.jobSelect = "jobset.sigs.k8s.io/jobset-name=" + js.Metadata.Name
	status := func() (restarts, counted int32) {
		var s struct {
			Status struct {
				Restarts                int32 `json:"restarts"`
				RestartsCountTowardsMax int32 `json:"restartsCountTowardsMax"`
			} `json:"status"`
		}
		if err := cp.do(http.MethodGet, resourcePath("jobset.x-k8s.io/v1alpha2", "JobSet", ns, js.Metadata.Name), "", nil, &s); err != nil {
			t.Fatal(err)
		}
		return s.Status.Restarts, s.Status.RestartsCountTowardsMax
	}
	// runSet waits for the set's two pods, starts them, rank 0 first.
	runSet := func(timeout time.Duration) ([]corev1.Pod, time.Time) {
		fresh, at := j.newPods(2, timeout)
		pods := j.start(fresh...)
		if completionIndex(pods[0]) > completionIndex(pods[1]) {
			pods[0], pods[1] = pods[1], pods[0]
		}
		return pods, at
	}
	// stop plays the kubelet for the pods the Job controller terminates.
	stop := func() {
		for _, p := range j.pods() {
			if p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodRunning {
				j.exit(p, multinodeCodes(143))
				j.forget(p)
			}
		}
	}
	pods, _ := runSet(60 * time.Second)
	var ds []time.Duration
	for i := 0; i < n; i++ {
		finished := j.exit(pods[1], multinodeCodes(75))
		var fresh []corev1.Pod
		var at time.Time
		waitFor(t, 2*time.Minute, "the set recreated", func() (bool, error) {
			stop()
			for _, p := range j.pods() {
				if !j.seen[p.UID] {
					fresh = append(fresh, p)
				}
			}
			if len(fresh) < 2 {
				fresh = fresh[:0]
				return false, nil
			}
			return true, nil
		})
		for _, p := range fresh {
			j.seen[p.UID] = true
		}
		at = time.Now()
		pods = j.start(fresh...)
		if completionIndex(pods[0]) > completionIndex(pods[1]) {
			pods[0], pods[1] = pods[1], pods[0]
		}
		ds = append(ds, at.Sub(finished))
		t.Logf("interruption %d: new set after %s", i+1, at.Sub(finished).Round(100*time.Millisecond))
	}
	if r, c := status(); r != int32(n) || c != 0 {
		t.Errorf("after %d interruptions: restarts %d, counted %d; want %d, 0", n, r, c, n)
	}
	t.Logf("JobSet controller, rank 1 exits 75 x%d: new set after %s", n, delays(ds))
	j.exit(pods[0], multinodeCodes(1))
	waitFor(t, 2*time.Minute, "the crash counted", func() (bool, error) {
		stop()
		_, c := status()
		return c == 1, nil
	})
}

// startJobSetController runs a JobSet controller binary against the
// control plane: its webhook server on 127.0.0.1 with a self-signed
// certificate (no webhook is registered), metrics off, probes on loopback.
func (cp *controlPlane) startJobSetController(bin string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	certDir := filepath.Join(cp.dir, "jobset-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	for _, f := range [][2]string{{"serving.crt", "tls.crt"}, {"serving.key", "tls.key"}} {
		b, err := os.ReadFile(filepath.Join(cp.dir, f[0]))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(certDir, f[1]), b, 0o600); err != nil {
			return err
		}
	}
	cfg := fmt.Sprintf(`apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement: {enable: false}
leaderElection: {leaderElect: false}
webhook: {host: 127.0.0.1, port: %d, certDir: %s}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:%d"}
`, ports[0], certDir, ports[1])
	cfgPath := filepath.Join(cp.dir, "jobset-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	if err := cp.startPath("jobset-controller", abs, "--config="+cfgPath, "--kubeconfig="+filepath.Join(cp.dir, "kubeconfig")); err != nil {
		return err
	}
	return cp.waitHTTP("jobset-controller", http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), 60*time.Second)
}
