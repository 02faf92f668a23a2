package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The metrics port is the same wherever a document or a manifest names it
// (#41 item 7: README said :9108, the manifests and example.env :9090).
// Pods use metricsPort; the node DaemonSet, on the node's own network, uses
// nodeMetricsPort so that it does not take a port the node already serves.
const (
	metricsPort     = "9090"
	nodeMetricsPort = "9108"
)

func TestMetricsPortsAgree(t *testing.T) {
	port := regexp.MustCompile(`(?:--metrics-addr[= ]|SPOTAGENT_METRICS_ADDR=)(?:\$\(POD_IP\)|127\.0\.0\.1)?:(\d+)`)
	container := regexp.MustCompile(`(?m)- name: metrics\s*\n\s*containerPort: (\d+)`)
	check := func(path, want string, needContainer bool) {
		t.Helper()
		text := read(t, path)
		ms := port.FindAllStringSubmatch(text, -1)
		if len(ms) == 0 {
			t.Errorf("%s names no metrics address", path)
		}
		for _, m := range ms {
			if m[1] != want {
				t.Errorf("%s: %s, want port %s", path, m[0], want)
			}
		}
		if !needContainer {
			return
		}
		cs := container.FindAllStringSubmatch(text, -1)
		if len(cs) == 0 {
			t.Errorf("%s: no containerPort named metrics", path)
		}
		for _, c := range cs {
			if c[1] != want {
				t.Errorf("%s: containerPort %s, want %s (its --metrics-addr)", path, c[1], want)
			}
		}
	}
	check("../README.md", metricsPort, false)
	check("systemd/example.env", metricsPort, false)
	manifests, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range manifests {
		if !strings.Contains(read(t, m), "--metrics-addr") {
			continue
		}
		n++
		if filepath.Base(m) == "daemonset.yaml" {
			check(m, nodeMetricsPort, true)
		} else {
			check(m, metricsPort, true)
		}
	}
	if n < 4 {
		t.Errorf("%d manifests serve metrics, want the sidecar pod and job, the multi-node job and jobset, and the DaemonSet", n)
	}
	// The docs that explain the two ports name both.
	for _, doc := range []string{"../docs/operations.md", "README.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), ":"+nodeMetricsPort) {
			t.Errorf("%s does not name the DaemonSet's port :%s", doc, nodeMetricsPort)
		}
	}
	if !strings.Contains(read(t, "../docs/operations.md"), ":"+metricsPort) {
		t.Errorf("docs/operations.md does not name the pods' port :%s", metricsPort)
	}
}
