package metrics

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// Every counter a dashboard or alert reads exists at 0 before its first
// event: the Grafana interruption panels showed "No data" until the first
// notice (#41 item 8).
func TestMetrics_LabelsPreCreated(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams := scrape(t, srv.URL)
	want := [][]string{{"spotagent_notices_total", "cloud", "signal", "kind", "termination"},
		{"spotagent_restore_source_bytes", "source", "local"}, {"spotagent_restore_source_bytes", "source", "peer"},
		{"spotagent_restore_source_bytes", "source", "store"}}
	for _, r := range FailureReasons {
		want = append(want, []string{"spotagent_commit_failures_total", "reason", r})
	}
	for _, c := range Components {
		want = append(want, []string{"spotagent_errors_total", "component", c})
	}
	for _, w := range want {
		if got, ok := value(fams, w[0], w[1:]...); !ok || got != 0 {
			t.Errorf("%v = %v (present %v) at start, want 0", w, got, ok)
		}
	}
	if _, ok := value(fams, "spotagent_notices_total", "cloud", "aws", "kind", "termination"); ok {
		t.Error("aws notices exist before Machine named the cloud")
	}
	m.Machine("aws", "g5.xlarge", "us-east-1a")
	fams = scrape(t, srv.URL)
	for _, k := range NoticeKinds {
		if got, ok := value(fams, "spotagent_notices_total", "cloud", "aws", "kind", k); !ok || got != 0 {
			t.Errorf("aws %s notices = %v (present %v) after Machine, want 0", k, got, ok)
		}
	}
}

// The pre-created labels are the ones pkg/supervisor uses: a new literal
// reason or component there must be added here.
func TestMetrics_LabelsMatchSupervisor(t *testing.T) {
	files, err := filepath.Glob("../supervisor/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no supervisor sources: %v", err)
	}
	calls := map[string]*regexp.Regexp{
		"CommitFailed": regexp.MustCompile(`Metrics\.CommitFailed\("([^"]+)"\)`),
		"Error":        regexp.MustCompile(`Metrics\.Error\("([^"]+)"\)`),
	}
	lists := map[string][]string{"CommitFailed": FailureReasons, "Error": Components}
	found := 0
	for _, f := range files {
		if filepath.Ext(f) != ".go" || regexp.MustCompile(`_test\.go$`).MatchString(f) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for call, re := range calls {
			for _, m := range re.FindAllSubmatch(b, -1) {
				found++
				if !slices.Contains(lists[call], string(m[1])) {
					t.Errorf("%s: Metrics.%s(%q) is not pre-created: add it to the list in pkg/metrics", f, call, m[1])
				}
			}
		}
	}
	if found < 5 {
		t.Fatalf("found %d literal calls in pkg/supervisor: the pattern no longer matches", found)
	}
}
