package deploy

// The restart delay per interruption on the real Job controller, over many
// successive interruptions. Long (the Job controller's backoff reaches its
// 10-minute cap at the seventh failure), so not part of `make test`:
//
//	SPOTAGENT_K8S_DELAYS=8 go test -tags disable_grpc_modules -run TestK8sReplacementDelay -v -timeout 60m ./deploy
//
// (~31 min for 8). deploy/README.md, "Restart delay", has the figures.

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

func delays(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.Round(100*time.Millisecond).String())
	}
	return strings.Join(s, ", ")
}

// jobFromFile decodes the Job of a manifest for a variant that changes it.
func jobFromFile(t *testing.T, path string) batchv1.Job {
	t.Helper()
	for _, d := range manifestDocs(t, path) {
		if d.kind == "Job" {
			var job batchv1.Job
			if err := yaml.UnmarshalStrict(d.yaml, &job); err != nil {
				t.Fatal(err)
			}
			return job
		}
	}
	t.Fatalf("%s: no Job", path)
	return batchv1.Job{}
}

func (cp *controlPlane) createJob(t *testing.T, ns string, job batchv1.Job) *jobRun {
	t.Helper()
	if err := cp.do(http.MethodPost, resourcePath("batch/v1", "Job", ns, "")+query("fieldValidation", "Strict"), "", job, nil); err != nil {
		t.Fatal(err)
	}
	return cp.newJobRun(t, ns, job.Name)
}

func TestK8sReplacementDelay(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SPOTAGENT_K8S_DELAYS"))
	if n <= 0 {
		t.Skip("SPOTAGENT_K8S_DELAYS=<interruptions> unset: 8 take ~31 min (the Job controller's backoff doubles to 10 min)")
	}
	t.Run("job75", func(t *testing.T) {
		// sidecar-job.yaml as shipped: the trainer exits 75 n times.
		t.Parallel()
		j, p := sidecarJob(t, "delay75")
		var ds []time.Duration
		for i := 0; i < n; i++ {
			finished := j.exit(p, map[string]int32{"trainer": 75, "spotagent": 0})
			var d time.Duration
			p, d = j.replaced(finished, 11*time.Minute)
			ds = append(ds, d)
			t.Logf("interruption %d: replacement after %s", i+1, d.Round(100*time.Millisecond))
		}
		j.wantRunning(0)
		t.Logf("Job, trainer exit 75 x%d: %s", n, delays(ds))
	})
	t.Run("multinode75", func(t *testing.T) {
		// multinode-job.yaml as shipped, both ranks exit 75: two failed pods
		// per interruption.
		t.Parallel()
		j, pods := multinodeJob(t, "delaymulti")
		var ds []time.Duration
		for i := 0; i < min(n, 4); i++ {
			finished := j.exit(pods[0], multinodeCodes(75))
			j.exit(pods[1], multinodeCodes(75))
			fresh, at := j.newPods(2, 11*time.Minute)
			pods = j.start(fresh...)
			if completionIndex(pods[0]) > completionIndex(pods[1]) {
				pods[0], pods[1] = pods[1], pods[0]
			}
			ds = append(ds, at.Sub(finished))
			t.Logf("interruption %d: both replaced after %s", i+1, at.Sub(finished).Round(100*time.Millisecond))
		}
		t.Logf("Indexed Job, 2 ranks exit 75 x%d: %s", min(n, 4), delays(ds))
	})
	t.Run("perIndex75", func(t *testing.T) {
		// backoffLimitPerIndex instead of backoffLimit: the per-index
		// backoff counts ignored failures too (index-failure-count +
		// index-ignored-failure-count).
		t.Parallel()
		cp := sharedControlPlane(t)
		ns := cp.namespace(t, "delayidx")
		cp.applyKinds(t, "kubernetes/multinode-job.yaml", ns, "ServiceAccount")
		job := jobFromFile(t, "kubernetes/multinode-job.yaml")
		job.Spec.BackoffLimit = nil
		perIndex := int32(3)
		job.Spec.BackoffLimitPerIndex = &perIndex
		j := cp.createJob(t, ns, job)
		fresh, _ := j.newPods(2, 30*time.Second)
		pods := j.start(fresh...)
		if completionIndex(pods[0]) > completionIndex(pods[1]) {
			pods[0], pods[1] = pods[1], pods[0]
		}
		var ds []time.Duration
		for i := 0; i < min(n, 4); i++ {
			finished := j.exit(pods[1], multinodeCodes(75))
			var d time.Duration
			pods[1], d = j.replaced(finished, 11*time.Minute)
			ds = append(ds, d)
		}
		t.Logf("Indexed Job with backoffLimitPerIndex, rank 1 exits 75 x%d: %s", min(n, 4), delays(ds))
	})
	t.Run("jobsetChild75", func(t *testing.T) {
		// What the Job controller contributes under the JobSet: rank 1
		// exits 75, the child Job fails; the set is recreated as a new Job
		// (the test does what BlockingRecreate does: delete the Job in the
		// foreground, wait until its pods are gone, create it again).
		t.Parallel()
		cp := sharedControlPlane(t)
		js, _ := readJobSet(t)
		ns := cp.namespace(t, "delayjs")
		cp.applyKinds(t, jobSetPath, ns, "ServiceAccount")
		child := childJob(js)
		var toFailed, toPods []time.Duration
		for i := 0; i < n; i++ {
			j := cp.createJob(t, ns, child)
			created := time.Now()
			fresh, at := j.newPods(2, 30*time.Second)
			toPods = append(toPods, at.Sub(created))
			pods := j.start(fresh...)
			finished := j.exit(pods[1], multinodeCodes(75))
			reason, d := j.fails(finished)
			if reason != "PodFailurePolicy" {
				t.Fatalf("child Job failed with %s", reason)
			}
			toFailed = append(toFailed, d)
			// Foreground deletion; the kubelet ends the terminating rank 0.
			fg := map[string]any{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
			if err := cp.do(http.MethodDelete, resourcePath("batch/v1", "Job", ns, child.Name), "", fg, nil); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 60*time.Second, "the child Job and its pods gone", func() (bool, error) {
				for _, p := range j.pods() {
					if p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodRunning {
						j.exit(p, multinodeCodes(143))
						j.forget(p)
					}
				}
				err := cp.do(http.MethodGet, resourcePath("batch/v1", "Job", ns, child.Name), "", nil, &batchv1.Job{})
				return isNotFound(err), nil
			})
		}
		t.Logf("JobSet child Job x%d: exit 75 → Job Failed after %s; new Job → pods after %s", n, delays(toFailed), delays(toPods))
	})
	t.Run("onFailureCounts", func(t *testing.T) {
		// In-place restarts (restartPolicy OnFailure, no podFailurePolicy)
		// count against backoffLimit: the kubelet's restart count of the
		// trainer reaching it fails the Job.
		t.Parallel()
		cp := sharedControlPlane(t)
		ns := cp.namespace(t, "onfailure")
		cp.applyKinds(t, "kubernetes/sidecar-job.yaml", ns, "ServiceAccount")
		job := jobFromFile(t, "kubernetes/sidecar-job.yaml")
		job.Spec.PodFailurePolicy = nil
		job.Spec.PodReplacementPolicy = nil
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		j := cp.createJob(t, ns, job)
		fresh, _ := j.newPods(1, 30*time.Second)
		p := j.start(fresh...)[0]
		for restarts := int32(1); restarts <= *job.Spec.BackoffLimit; restarts++ {
			now := metav1.Now()
			st := p.Status.DeepCopy()
			for i := range st.ContainerStatuses {
				if st.ContainerStatuses[i].Name == "trainer" {
					st.ContainerStatuses[i].RestartCount = restarts
					st.ContainerStatuses[i].LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
						ExitCode: 75, Reason: "Error", StartedAt: *p.Status.StartTime, FinishedAt: now}}
				}
			}
			p = j.patchStatus(p, *st)
		}
		reason, _ := j.fails(time.Now())
		if reason != "BackoffLimitExceeded" {
			t.Errorf("job failed with %s", reason)
		}
		t.Logf("restartPolicy OnFailure: %d in-place restarts (exit 75) failed the Job: %s", *job.Spec.BackoffLimit, reason)
	})
}
