package main

import (
	"strings"
	"testing"
)

// `watch --cloud none` has nothing to watch: it says so and exits 2 rather
// than wait forever in silence (#41 item 3).
func TestCLI_WatchCloudNone(t *testing.T) {
	code, out, errOut := cli(t, "watch", "--cloud", "none")
	if code != 2 || out != "" || !strings.Contains(errOut, "--cloud none: no metadata service to watch") {
		t.Fatalf("watch --cloud none: exit %d, stdout %q, stderr %q; want 2 and the reason", code, out, errOut)
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 sessions", 1: "1 session", 2: "2 sessions"} {
		if got := plural(n, "session"); got != want {
			t.Errorf("plural(%d)=%q, want %q", n, got, want)
		}
	}
}
