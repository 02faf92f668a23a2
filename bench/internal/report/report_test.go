package report

import (
	"strings"
	"testing"
)

// TestMarkdown: the machine table, the targets with their verdicts, the
// sections in the order added, each command once.
func TestMarkdown(t *testing.T) {
	r := New("/nonexistent/spotagent", "/nonexistent/minio")
	r.Target(Target{Name: "notice → committed", Want: "≤ 30 s", Got: "12 s", Met: true, Margin: "2.5×"})
	r.Target(Target{Name: "restore", Want: "≥ 1 GB/s", Got: "0.4 GB/s", Margin: "0.4×"})
	r.Add("Upload", "upload body\n\n\n")
	r.Add("Restore", "restore body")
	r.Command("spotagent run A")
	r.Command("spotagent run A")
	r.Command("spotagent restore B")
	md := r.Markdown()
	for _, want := range []string{
		"| cpu |", "| spotagent | unavailable",
		"| notice → committed | ≤ 30 s | 12 s | **met** (2.5×) |",
		"| restore | ≥ 1 GB/s | 0.4 GB/s | **missed** (0.4×) |",
		"## Upload\n\nupload body\n\n## Restore",
		"```\nspotagent run A\nspotagent restore B\n```",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if n := strings.Count(md, "spotagent run A"); n != 1 {
		t.Errorf("command listed %d times, want once", n)
	}
	if r.Took() < 0 {
		t.Error("Took negative")
	}
}
