package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/metadata"

	"github.com/spotagent/spotagent/internal/render"
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
		if got := render.Plural(n, "session"); got != want {
			t.Errorf("plural(%d)=%q, want %q", n, got, want)
		}
	}
}

// At the default level (warn) a read-only command's "still reading" lines
// stay quiet off a terminal; --log-level info shows them (#41 item 5).
func TestCLI_BusyFollowsLogLevel(t *testing.T) {
	defer func(d, e time.Duration) { busyAfter, progressEvery = d, e }(busyAfter, progressEvery)
	busyAfter, progressEvery = 0, time.Millisecond
	_, uri := testStore(t, sampleJournal())
	code, _, errOut := cli(t, "history", "--store", uri)
	if code != 0 || strings.Contains(errOut, "INFO") {
		t.Fatalf("history at the default level: exit %d, stderr %q; want 0 and no INFO line", code, errOut)
	}
}

// Without a metadata service the agent says what that means instead of
// logging a machine with empty fields; a machine logs only what it has.
func TestLogMachine(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	logMachine(zap.New(core), metadata.Identity{Cloud: metadata.CloudNone})
	logMachine(zap.New(core), metadata.Identity{Cloud: metadata.CloudAWS, InstanceType: "g5.xlarge"})
	all := logs.All()
	if len(all) != 2 || all[0].Message == "machine" || !strings.Contains(all[0].Message, "only SIGTERM and SIGINT") {
		t.Fatalf("--cloud none logged %+v", all)
	}
	if got := all[1].ContextMap(); all[1].Message != "machine" || len(got) != 2 || got["instance_type"] != "g5.xlarge" {
		t.Fatalf("machine logged %v, want cloud and instance_type only", got)
	}
}

// Console logs give durations with their unit; JSON keeps seconds.
func TestLogDurationUnits(t *testing.T) {
	for format, want := range map[string]string{"console": `"upload": "81ms"`, "json": `"upload":0.081321945`} {
		var b strings.Builder
		log, err := newLoggerTo(&b, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Info("checkpoint committed", zap.Duration("upload", 81321945*time.Nanosecond))
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s: %q lacks %s", format, b.String(), want)
		}
	}
}

// TestLogger_FloodBounded: one message repeated 20,000 times (a trainer repeating a refused message) writes at most the
// sampler's first 1,000 and one in 1,000 after; another message in the
// same second is still written.
func TestLogger_FloodBounded(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLoggerTo(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20000; i++ {
		log.Warn("unsolicited done refused")
	}
	log.Info("checkpoint committed")
	n := strings.Count(buf.String(), "unsolicited done refused")
	// Within a second: 1,000 + 19. A loaded machine may spread the loop
	// over two or three of the sampler's seconds: still far below 20,000.
	if n < logSampleFirst || n > 3*(logSampleFirst+20000/logSampleThereafter) {
		t.Errorf("%d lines of one repeated message of 20,000, want %d to %d", n, logSampleFirst, 3*(logSampleFirst+20000/logSampleThereafter))
	}
	if !strings.Contains(buf.String(), "checkpoint committed") {
		t.Error("another message was dropped with the flood")
	}
}
