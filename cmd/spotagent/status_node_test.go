package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/nodemode"
)

// startNodeAgent runs a real node agent (nodemode.Run) on file
// stores, its socket at sock, until the test ends, with a trainer
// connected to each of runs.
func startNodeAgent(t *testing.T, sock string, runs ...string) {
	t.Helper()
	dir := shortTempDir(t)
	sigs, done := make(chan os.Signal, 2), make(chan error, 1)
	cfg := nodemode.Config{
		StorePrefix: "file://" + filepath.Join(dir, "runs"), CheckpointRoot: filepath.Join(dir, "ckpt"),
		Server: protocol.ServerConfig{Path: sock},
		OpenStore: func(_ context.Context, uri string) (cloud.Store, error) {
			return file.New(strings.TrimPrefix(uri, "file://"))
		},
		NewScheduler: func() *schedule.Scheduler { return schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Hour}) },
		Run:          supervisor.Config{TermGrace: 5 * time.Second},
	}
	go func() { done <- nodemode.Run(context.Background(), cfg, sigs) }()
	t.Cleanup(func() {
		sigs <- syscall.SIGTERM
		if err := <-done; err != nil {
			t.Errorf("nodemode.Run: %v", err)
		}
	})
	for _, run := range runs {
		var c *protocol.Client
		testutil.WaitFor(t, "the node's socket", func() bool {
			var err error
			c, err = protocol.Dial(t.Context(), sock)
			return err == nil
		})
		t.Cleanup(func() { c.Close() })
		if _, err := c.Hello(t.Context(), protocol.Message{PID: os.Getpid(), RunID: run}); err != nil {
			t.Fatalf("hello %s: %v", run, err)
		}
	}
}

// TestRunStatus_NodeAgent (#41 item 4): `spotagent status` against a node
// agent with two trainers shows each run, its trainer and its next
// checkpoint; --run-id picks one (and finds the node's default socket);
// a run it does not serve is an error that names the ones it does.
func TestRunStatus_NodeAgent(t *testing.T) {
	t.Setenv("TMPDIR", shortTempDir(t))
	t.Setenv("XDG_RUNTIME_DIR", "")
	sock := defaultSocket("node")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	startNodeAgent(t, sock, "exp1", "exp2")
	var out, errb bytes.Buffer
	testutil.WaitFor(t, "both trainers in the status", func() bool {
		out.Reset()
		errb.Reset()
		return runStatus(t, []string{"--socket", sock}, &out, &errb) == 0 &&
			strings.Count(out.String(), "trainers:        1 connected\n") == 2
	})
	t.Logf("spotagent status against a node agent:\n%s", out.String())
	for _, want := range []string{"node agent: store prefix file://", ", 2 runs\n", "run:             exp1\n", "run:             exp2\n",
		"next checkpoint: in ", "interval:        1h0m0s\n",
		"cloud:           none (no metadata service: only SIGTERM and SIGINT announce an interruption)\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := runStatus(t, []string{"--run-id", "exp2"}, &out, &errb); code != 0 {
		t.Fatalf("--run-id exp2: exit %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(out.String(), "run:             exp2\n") || strings.Contains(out.String(), "exp1") {
		t.Fatalf("--run-id exp2 printed:\n%s", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := runStatus(t, []string{"--socket", sock, "--run-id", "exp9"}, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), `no run "exp9" (its runs: exp1, exp2)`) {
		t.Fatalf("--run-id exp9: exit %d, stderr %q", code, errb.String())
	}
}
