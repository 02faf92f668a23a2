package peernet

import (
	"os"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/bench/internal/report"
)

// TestMain lets the test binary be the section's children, as spotbench
// is: `peernet.test peernet serve|recv ...`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "peernet" {
		os.Exit(Child(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// The section on a small file: as root, two namespaces, both children,
// every mode measured with its CPU, the verification figures and both
// targets in the report, and nothing left behind; not root, it says it
// skipped and why.
func TestBench(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := report.New("/nonexistent/spotagent", "/nonexistent/minio")
	work := t.TempDir()
	if err := Bench(r, Options{Self: self, Work: work, MiB: 8, Rounds: 5}); err != nil {
		t.Fatal(err)
	}
	md := r.Markdown()
	if os.Geteuid() != 0 {
		if !strings.Contains(md, "Skipped: network namespaces need root") {
			t.Fatalf("not root, and the section does not say it skipped:\n%s", md)
		}
		return
	}
	if strings.Contains(md, "Skipped:") {
		t.Skipf("root, but no namespaces here: %s", md[strings.Index(md, "Skipped:"):])
	}
	for _, want := range append(Modes, "peer transfer into a verified file ÷ one TCP stream into a file", "local verification (BLAKE3 digest of the kept copy), per core", "Ratios of the medians: peer-file ÷ tcp-file") {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	if ents, _ := os.ReadDir(work); len(ents) != 0 {
		t.Errorf("left in the work directory: %v", ents)
	}
}
