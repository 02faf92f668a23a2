package deploy

import (
	"net"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// heartbeatPort is the UDP port of c's --peer-listen, which its container
// port named heartbeat must declare.
func heartbeatPort(t *testing.T, c corev1.Container) int {
	t.Helper()
	_, p, err := net.SplitHostPort(flagValue(c, "peer-listen"))
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port == 0 {
		t.Fatalf("%s: --peer-listen %q: want a fixed port, for a firewall or NetworkPolicy to name", c.Name, flagValue(c, "peer-listen"))
	}
	for _, cp := range c.Ports {
		if cp.Name == "heartbeat" {
			if int(cp.ContainerPort) != port || cp.Protocol != corev1.ProtocolUDP {
				t.Errorf("%s: container port heartbeat %d/%s, want %d/UDP (its --peer-listen)", c.Name, cp.ContainerPort, cp.Protocol, port)
			}
			return port
		}
	}
	t.Errorf("%s: no container port named heartbeat", c.Name)
	return port
}

// admits says whether pol lets a pod labelled from (in the policy's
// namespace) reach port/proto of a pod whose containers are cs.
func admits(pol *networkingv1.NetworkPolicy, from map[string]string, proto corev1.Protocol, port int, cs []corev1.Container) bool {
	named := map[string]int{}
	for _, c := range cs {
		for _, p := range c.Ports {
			named[p.Name] = int(p.ContainerPort)
		}
	}
	for _, r := range pol.Spec.Ingress {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			pr := corev1.ProtocolTCP
			if p.Protocol != nil {
				pr = *p.Protocol
			}
			if pr != proto {
				continue
			}
			switch {
			case p.Port == nil:
				portOK = true
			case p.Port.StrVal != "":
				portOK = portOK || named[p.Port.StrVal] == port
			default:
				portOK = portOK || int(p.Port.IntVal) == port
			}
		}
		if !portOK {
			continue
		}
		if len(r.From) == 0 {
			return true
		}
		for _, peer := range r.From {
			if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil {
				return true // wider than this namespace's pods: counted as anyone
			}
			sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
			if err == nil && sel.Matches(labels.Set(from)) {
				return true
			}
		}
	}
	return false
}

// TestMultinodeHeartbeatPolicy (#37, review): the multi-node manifests'
// NetworkPolicy selects the job's pods; the job's own pods reach each other
// on every port (the heartbeats, the rendezvous, the collectives, the peer
// tier); anyone else reaches only the metrics port, so that in a namespace
// with a default-deny policy it opens nothing more. Its ports are numbers
// (some CNIs do not resolve a native sidecar's named ports). The real
// control plane accepts it (TestK8sManifestsApply).
func TestMultinodeHeartbeatPolicy(t *testing.T) {
	objs := decodeManifests(t, "kubernetes/multinode-job.yaml")
	job := only[*batchv1.Job](t, objs)
	t.Run("job", func(t *testing.T) {
		checkHeartbeatPolicy(t, only[*networkingv1.NetworkPolicy](t, objs), job.Spec.Template,
			"batch.kubernetes.io/job-name", job.Name)
	})
	t.Run("jobset", func(t *testing.T) {
		js, _ := readJobSet(t)
		var pol networkingv1.NetworkPolicy
		n := 0
		for _, d := range manifestDocs(t, jobSetPath) {
			if d.kind == "NetworkPolicy" {
				n++
				if err := yaml.UnmarshalStrict(d.yaml, &pol); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n != 1 {
			t.Fatalf("%s: %d NetworkPolicies, want 1", jobSetPath, n)
		}
		checkHeartbeatPolicy(t, &pol, js.Spec.ReplicatedJobs[0].Template.Spec.Template,
			"jobset.sigs.k8s.io/jobset-name", js.Metadata.Name)
	})
}

// checkHeartbeatPolicy checks pol against the pods of tmpl, which their
// controller labels key=name.
func checkHeartbeatPolicy(t *testing.T, pol *networkingv1.NetworkPolicy, tmpl corev1.PodTemplateSpec, key, name string) {
	t.Helper()
	spec := tmpl.Spec
	var sidecar corev1.Container
	for _, c := range spec.InitContainers {
		if c.Name == "spotagent" {
			sidecar = c
		}
	}
	port := heartbeatPort(t, sidecar)
	pod := map[string]string{key: name}
	other := map[string]string{key: "another-job"}
	for k, v := range tmpl.Labels {
		pod[k], other[k] = v, v
	}
	sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(pod)) || sel.Matches(labels.Set(other)) {
		t.Errorf("the policy's podSelector %v must select this job's pods, not another job's with the same template (%v)", pol.Spec.PodSelector, err)
	}
	// #46 item 3: it admits by a label the chart sets (spotagent.io/run-id,
	// the run id) AND the controller's label of the name the chart gives the
	// job: neither alone, and not another run's pods.
	run := tmpl.Labels["spotagent.io/run-id"]
	if run != name {
		t.Errorf("pod template label spotagent.io/run-id=%q, want the run id %q", run, name)
	}
	cs0 := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for what, from := range map[string]map[string]string{
		"the controller's label alone": {key: name},
		"the chart's label alone":      {"spotagent.io/run-id": name},
		"another run's chart label":    {key: name, "spotagent.io/run-id": "another-run"},
	} {
		if admits(pol, from, corev1.ProtocolUDP, heartbeatPort(t, sidecarOf(spec)), cs0) {
			t.Errorf("a pod with %s (%v) reaches the heartbeat port", what, from)
		}
		if sel.Matches(labels.Set(from)) {
			t.Errorf("the podSelector selects a pod with %s (%v)", what, from)
		}
	}
	ingress := false
	for _, pt := range pol.Spec.PolicyTypes {
		ingress = ingress || pt == networkingv1.PolicyTypeIngress
	}
	if !ingress {
		t.Error("policyTypes must include Ingress")
	}
	cs := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	if !admits(pol, pod, corev1.ProtocolUDP, port, cs) {
		t.Errorf("the job's pods cannot send heartbeats (UDP %d) to each other", port)
	}
	if admits(pol, other, corev1.ProtocolUDP, port, cs) || admits(pol, map[string]string{}, corev1.ProtocolUDP, port, cs) {
		t.Errorf("pods outside the job may send to the heartbeat port (UDP %d)", port)
	}
	outsider := map[string]string{"app": "prometheus"}
	for _, p := range []int{29500, 9090, 45000, port} { // the rendezvous, metrics, a collective's port, the peer tier
		if !admits(pol, pod, corev1.ProtocolTCP, p, cs) {
			t.Errorf("the job's pods cannot reach each other on TCP %d", p)
		}
		if got, want := admits(pol, outsider, corev1.ProtocolTCP, p, cs), p == 9090; got != want {
			t.Errorf("a pod outside the job reaches TCP %d: %v, want %v (only metrics)", p, got, want)
		}
	}
	for _, r := range pol.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port != nil && p.Port.StrVal != "" {
				t.Errorf("port %q: name a number (some CNIs do not resolve a native sidecar's named ports)", p.Port.StrVal)
			}
		}
	}
}

func sidecarOf(spec corev1.PodSpec) corev1.Container {
	for _, c := range spec.InitContainers {
		if c.Name == "spotagent" {
			return c
		}
	}
	return corev1.Container{}
}

// TestDaemonSetHeartbeatPort (#37): the node agent listens for the
// heartbeats of the multi-node runs it hosts on a fixed port of the node,
// declared as a UDP container port, bound to and advertised at the node IP.
func TestDaemonSetHeartbeatPort(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, decodeManifests(t, "kubernetes/daemonset.yaml"))
	c := ds.Spec.Template.Spec.Containers[0]
	heartbeatPort(t, c)
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("the node agent's heartbeat port must be on the node's network (hostNetwork)")
	}
	if host, _, _ := net.SplitHostPort(flagValue(c, "peer-listen")); host != "$(POD_IP)" || flagValue(c, "peer-advertise") != "$(POD_IP)" {
		t.Errorf("--peer-listen %q --peer-advertise %q: bind and advertise the node IP, $(POD_IP)", flagValue(c, "peer-listen"), flagValue(c, "peer-advertise"))
	}
}

// runtimePodTemplate is the pod template of a ClusterTrainingRuntime doc.
func runtimePodTemplate(t *testing.T, d manifestDoc) (string, corev1.PodTemplateSpec) {
	t.Helper()
	var rt struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     struct {
			Template struct {
				Spec struct {
					ReplicatedJobs []struct {
						Template struct {
							Spec struct {
								Template corev1.PodTemplateSpec `json:"template"`
							} `json:"spec"`
						} `json:"template"`
					} `json:"replicatedJobs"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(d.yaml, &rt); err != nil {
		t.Fatal(err)
	}
	if len(rt.Spec.Template.Spec.ReplicatedJobs) != 1 {
		t.Fatalf("runtime %s: %d replicatedJobs, want 1", rt.Metadata.Name, len(rt.Spec.Template.Spec.ReplicatedJobs))
	}
	return rt.Metadata.Name, rt.Spec.Template.Spec.ReplicatedJobs[0].Template.Spec.Template
}

// TestKubeflowRuntimePolicy (#45): the Kubeflow runtime's NetworkPolicy,
// one per namespace of kubeflow.runtime.networkPolicy.namespaces (none
// listed: one without a namespace, for kubectl apply -n), selects the
// runtime's pods (the chart's spotagent.io/runtime label and the JobSet
// controller's jobset-name) and lets only them reach the heartbeat, peer
// and rendezvous ports; anyone reaches metrics. It cannot tell one
// TrainJob of the runtime from another in the same namespace (the runtime
// does not know their names): the test holds that, as the docs say it.
// TestK8sTrainJob applies it beside the Trainer's JobSet and checks it
// against the pods' template there.
func TestKubeflowRuntimePolicy(t *testing.T) {
	policies := func(t *testing.T, path string) (string, corev1.PodTemplateSpec, []networkingv1.NetworkPolicy) {
		t.Helper()
		rt, docs := runtimeDocs(t, path)
		name, tmpl := runtimePodTemplate(t, rt)
		var pols []networkingv1.NetworkPolicy
		for _, d := range docs {
			var pol networkingv1.NetworkPolicy
			if err := yaml.UnmarshalStrict(d.yaml, &pol); err != nil {
				t.Fatal(err)
			}
			pols = append(pols, pol)
		}
		return name, tmpl, pols
	}
	t.Run("shipped", func(t *testing.T) {
		name, tmpl, pols := policies(t, trainerRuntimePath)
		if len(pols) != 1 || pols[0].Namespace != "" {
			t.Fatalf("%s: %d NetworkPolicies (%v), want 1 without a namespace", trainerRuntimePath, len(pols), pols)
		}
		if tmpl.Labels["spotagent.io/runtime"] != name {
			t.Errorf("the runtime's pod template: label spotagent.io/runtime=%q, want the runtime's name %q", tmpl.Labels["spotagent.io/runtime"], name)
		}
		checkRuntimePolicy(t, &pols[0], tmpl, "exp42")
	})
	t.Run("namespaces", func(t *testing.T) {
		out, err := render(t, "kubeflow/torch-distributed-spotagent", "kubeflow.runtime.name=torch-spot",
			"kubeflow.runtime.networkPolicy.namespaces={team-a,team-b}")
		if err != nil {
			t.Fatal(err)
		}
		_, tmpl, pols := policies(t, out)
		var nss []string
		for _, p := range pols {
			nss = append(nss, p.Namespace)
			if p.Name != "torch-spot-ingress" {
				t.Errorf("policy %s/%s: want torch-spot-ingress", p.Namespace, p.Name)
			}
			checkRuntimePolicy(t, &p, tmpl, "exp42")
		}
		if strings.Join(nss, ",") != "team-a,team-b" {
			t.Errorf("policies in namespaces %v, want team-a, team-b", nss)
		}
	})
	t.Run("off", func(t *testing.T) {
		out, err := render(t, "kubeflow/torch-distributed-spotagent", "kubeflow.runtime.networkPolicy.enabled=false")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, pols := policies(t, out); len(pols) != 0 {
			t.Errorf("kubeflow.runtime.networkPolicy.enabled=false: %d NetworkPolicies", len(pols))
		}
	})
	t.Run("beside a JobSet", func(t *testing.T) { // one release, both policies, no name clash
		out, err := render(t, "multinode-jobset", "kubeflow.runtime.enabled=true", "kubeflow.runtime.storePrefix=s3://my-bucket/tj/")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range manifestDocs(t, out) {
			if d.kind == "NetworkPolicy" {
				names = append(names, d.name)
			}
		}
		if len(names) != 2 || names[0] == names[1] {
			t.Errorf("NetworkPolicies %v: want the JobSet's and the runtime's", names)
		}
	})
}

// checkRuntimePolicy checks the runtime's pol against the pods of tmpl as
// the JobSet controller creates them for TrainJob job.
func checkRuntimePolicy(t *testing.T, pol *networkingv1.NetworkPolicy, tmpl corev1.PodTemplateSpec, job string) {
	t.Helper()
	const key = "jobset.sigs.k8s.io/jobset-name"
	withLabels := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range tmpl.Labels {
			m[k] = v
		}
		for k, v := range extra {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	pod := withLabels(map[string]string{key: job})
	spec := tmpl.Spec
	cs := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	hb := heartbeatPort(t, sidecarOf(spec))
	sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(pod)) {
		t.Fatalf("the policy's podSelector %v does not select the runtime's pods %v (%v)", pol.Spec.PodSelector, pod, err)
	}
	ingress := false
	for _, pt := range pol.Spec.PolicyTypes {
		ingress = ingress || pt == networkingv1.PolicyTypeIngress
	}
	if !ingress {
		t.Error("policyTypes must include Ingress")
	}
	for _, p := range []int{29500, 45000, hb} { // the rendezvous, a collective's port, the peer tier
		if !admits(pol, pod, corev1.ProtocolTCP, p, cs) {
			t.Errorf("the job's pods cannot reach each other on TCP %d", p)
		}
	}
	if !admits(pol, pod, corev1.ProtocolUDP, hb, cs) {
		t.Errorf("the job's pods cannot send heartbeats (UDP %d) to each other", hb)
	}
	// What the policy can and cannot tell apart.
	for what, c := range map[string]struct {
		from  map[string]string
		admit bool
	}{
		"another TrainJob on this runtime, same namespace (the docs say so)": {withLabels(map[string]string{key: "exp43"}), true},
		"a pod of another runtime":                       {withLabels(map[string]string{key: job, "spotagent.io/runtime": "other-runtime"}), false},
		"a pod with the runtime's label but no JobSet's": {withLabels(map[string]string{key: ""}), false},
		"a pod with the JobSet's label but no runtime's": {withLabels(map[string]string{"spotagent.io/runtime": ""}), false},
		"an unlabelled pod":                              {map[string]string{}, false},
		"Prometheus":                                     {map[string]string{"app": "prometheus"}, false},
	} {
		for _, pp := range []struct {
			proto corev1.Protocol
			port  int
		}{{corev1.ProtocolUDP, hb}, {corev1.ProtocolTCP, hb}, {corev1.ProtocolTCP, 29500}} {
			if got := admits(pol, c.from, pp.proto, pp.port, cs); got != c.admit {
				t.Errorf("%s (%v) reaches %s %d: %v, want %v", what, c.from, pp.proto, pp.port, got, c.admit)
			}
		}
		if !admits(pol, c.from, corev1.ProtocolTCP, 9090, cs) {
			t.Errorf("%s cannot reach the metrics port (TCP 9090)", what)
		}
	}
	for _, r := range pol.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port != nil && p.Port.StrVal != "" {
				t.Errorf("port %q: name a number (some CNIs do not resolve a native sidecar's named ports)", p.Port.StrVal)
			}
		}
	}
}
