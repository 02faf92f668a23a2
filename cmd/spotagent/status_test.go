package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"

	"github.com/spotagent/spotagent/internal/render"
)

// shortTempDir keeps socket paths under the 108-byte sun_path limit.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fakeAgent serves a real protocol.Server at path and answers every status
// request with st. With needHello it refuses status on a connection that has
// not said hello, as a stricter agent might.
func fakeAgent(t *testing.T, path string, st supervisor.Status, needHello bool) (hellos <-chan struct{}) {
	t.Helper()
	srv, err := protocol.Listen(protocol.ServerConfig{Path: path})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	hello := make(chan struct{}, 4)
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		for ev := range srv.Events() {
			switch ev.Msg.Type {
			case protocol.TypeHello:
				hello <- struct{}{}
				ev.Conn.Send(protocol.Message{Type: protocol.TypeWelcome, Version: 1, RunID: st.RunID})
			case protocol.TypeStatus:
				if _, ok := ev.Conn.Hello(); needHello && !ok {
					ev.Conn.Send(protocol.Message{Type: protocol.TypeError, Error: "say hello first"})
					continue
				}
				b, err := json.Marshal(st)
				if err != nil {
					panic(err)
				}
				ev.Conn.Send(protocol.Message{Type: protocol.TypeStatus, Status: b})
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		<-handled
	})
	return hello
}

func sampleStatus(now time.Time) supervisor.Status {
	next := now.Add(10*time.Minute + 48*time.Second)
	return supervisor.Status{
		RunID: "exp42", Store: "s3://bucket/runs/exp42", Cloud: metadata.CloudAWS,
		Instance: metadata.Identity{Cloud: metadata.CloudAWS, InstanceID: "i-0abc", InstanceType: "g5.xlarge", Zone: "us-east-1a", Lifecycle: "spot"},
		Started:  now.Add(-2*time.Hour - 3*time.Minute),
		Child:    &supervisor.ChildStatus{PID: 4242, Running: true, Restarts: 1},
		Trainers: 1,
		LastCheckpoint: &supervisor.CheckpointStatus{
			ID: "3f9a1c07b2e4", Step: 1200, At: now.Add(-4*time.Minute - 12*time.Second), Bytes: 3 << 29,
		},
		NextCheckpoint: &next,
		Interval:       "15m0s",
		Uploading:      1,
		Pending:        0,
		NoticesSeen:    2,
		LastNotice: &metadata.Notice{
			Cloud: metadata.CloudAWS, Kind: metadata.KindRebalance, ID: "r1", Detected: now.Add(-5 * time.Minute),
		},
		Step: 1530,
		NoticePromise: promise.Describe(schedule.Estimate{Bytes: 3 << 29, Save: 1200 * time.Millisecond,
			Upload: 3100 * time.Millisecond, Took: 4400 * time.Millisecond, Rate: 519e6, Source: "checkpoint"},
			schedule.CloudNotices[0], 5*time.Second),
	}
}

// statusSample is what status prints for sampleStatus, in UTC.
func statusSample(t *testing.T) string {
	t.Helper()
	defer func(l *time.Location) { time.Local = l }(time.Local)
	time.Local = time.UTC
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	st := sampleStatus(now)
	var out bytes.Buffer
	if err := render.Status(&out, &st, now); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestWriteStatus(t *testing.T) {
	defer func(l *time.Location) { time.Local = l }(time.Local)
	time.Local = time.UTC
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

	t.Run("Running", func(t *testing.T) {
		want := `run:             exp42
store:           s3://bucket/runs/exp42
cloud:           aws (i-0abc, g5.xlarge, us-east-1a, spot)
started:         2026-05-04 09:57:00 (2h3m0s ago)
child:           pid 4242, running, 1 restarts
trainers:        1 connected
step:            1530 (newest progress)
last checkpoint: step 1200, id 3f9a1c07b2e4, 4m12s ago, 1.5 GiB
next checkpoint: in 10m48s (2026-05-04 12:10:48)
interval:        15m0s
on a notice:     checkpoint needs ~4.4s (1.5 GiB, save 1.2s, 519 MB/s upload, this session's newest checkpoint); fits aws 1m55s, gcp 25s, azure 25s (notice − --margin 5s)
uploading:       1 (requests awaiting the trainer: 0)
notices seen:    2, last: aws rebalance seen 5m0s ago
stopping:        no
`
		if got := statusSample(t); got != want {
			t.Fatalf("output:\n%s\nwant:\n%s", got, want)
		}
	})
	t.Run("NoTrainer", func(t *testing.T) {
		// A running trainer that never connected: status says it is not
		// protected, and that nothing was committed.
		st := sampleStatus(now)
		st.Trainers, st.LastCheckpoint = 0, nil
		var out bytes.Buffer
		if err := render.Status(&out, &st, now); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"trainers:        0 connected: nothing is being checkpointed (the trainer needs SPOTAGENT_SOCKET and spotagent.connect())\n",
			"last checkpoint: none committed: an interruption now would lose everything\n",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	})
	t.Run("Stopping", func(t *testing.T) {
		st := sampleStatus(now)
		st.Child, st.LastCheckpoint, st.NextCheckpoint = nil, nil, nil
		st.Stopping = "interruption"
		st.LastNotice = &metadata.Notice{Cloud: metadata.CloudGCP, Kind: metadata.KindTermination, Action: "preempt",
			Detected: now.Add(-3 * time.Second), Deadline: now.Add(27 * time.Second)}
		var out bytes.Buffer
		if err := render.Status(&out, &st, now); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"child:           none (the trainer runs elsewhere)\n",
			"last checkpoint: none committed: an interruption now would lose everything\n",
			"next checkpoint: none (stopping)\n",
			"notices seen:    2, last: gcp termination (preempt) seen 3s ago, deadline 2026-05-04 12:00:27\n",
			"stopping:        yes (interruption)\n",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	})
}

// runStatus runs `spotagent status ARGS` in-process.
func runStatus(t *testing.T, args []string, stdout, stderr *bytes.Buffer) int {
	t.Helper()
	return execute(append([]string{"status"}, args...), stdout, stderr)
}

func TestRunStatus(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)

	t.Run("OK", func(t *testing.T) {
		path := filepath.Join(shortTempDir(t), "exp42.sock")
		fakeAgent(t, path, sampleStatus(now), false)
		var out, errb bytes.Buffer
		if code := runStatus(t, []string{"--socket", path}, &out, &errb); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
		for _, want := range []string{"run:             exp42\n", "child:           pid 4242, running, 1 restarts\n",
			"last checkpoint: step 1200, id 3f9a1c07b2e4, "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	})
	t.Run("JSON", func(t *testing.T) {
		path := filepath.Join(shortTempDir(t), "exp42.sock")
		fakeAgent(t, path, sampleStatus(now), false)
		var out, errb bytes.Buffer
		if code := runStatus(t, []string{"--socket", path, "--json"}, &out, &errb); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
		var got supervisor.Status
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("--json output %q: %v", out.String(), err)
		}
		if got.RunID != "exp42" || got.LastCheckpoint == nil || got.LastCheckpoint.Step != 1200 {
			t.Fatalf("--json decoded to %+v", got)
		}
	})
	t.Run("HelloRequired", func(t *testing.T) {
		path := filepath.Join(shortTempDir(t), "exp42.sock")
		hellos := fakeAgent(t, path, sampleStatus(now), true)
		var out, errb bytes.Buffer
		if code := runStatus(t, []string{"--socket", path}, &out, &errb); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
		if len(hellos) != 1 {
			t.Fatalf("hellos=%d, want 1", len(hellos))
		}
		if !strings.Contains(out.String(), "run:             exp42\n") {
			t.Fatalf("output:\n%s", out.String())
		}
	})
	t.Run("DefaultSocket", func(t *testing.T) {
		t.Setenv("TMPDIR", shortTempDir(t))
		fakeAgent(t, defaultSocket("exp42"), sampleStatus(now), false)
		for _, args := range [][]string{{"--run-id", "exp42"}, {"--store", "s3://bucket/runs/exp42"}, nil} {
			var out, errb bytes.Buffer
			if code := runStatus(t, args, &out, &errb); code != 0 {
				t.Fatalf("%v: exit %d, stderr %q", args, code, errb.String())
			}
			if !strings.HasPrefix(out.String(), "run:             exp42\n") {
				t.Fatalf("%v: output:\n%s", args, out.String())
			}
		}
	})
	t.Run("ErrNoAgent", func(t *testing.T) {
		dir := shortTempDir(t)
		// A stale socket file with nobody listening, and no file at all.
		stale := filepath.Join(dir, "stale.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		if _, err := os.Lstat(stale); err != nil {
			t.Fatalf("stale socket: %v", err)
		}
		for _, path := range []string{filepath.Join(dir, "missing.sock"), stale} {
			var out, errb bytes.Buffer
			if code := runStatus(t, []string{"--socket", path}, &out, &errb); code != 1 {
				t.Fatalf("%s: exit %d, want 1", path, code)
			}
			want := fmt.Sprintf("spotagent status: no agent listening at %s\n", path)
			if errb.String() != want || out.Len() != 0 {
				t.Fatalf("%s: stderr %q stdout %q, want stderr %q", path, errb.String(), out.String(), want)
			}
		}
	})
	t.Run("ErrNoSocketDir", func(t *testing.T) {
		t.Setenv("TMPDIR", shortTempDir(t))
		var out, errb bytes.Buffer
		if code := runStatus(t, nil, &out, &errb); code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		if !strings.Contains(errb.String(), "no agent socket in") || strings.Count(errb.String(), "\n") != 1 {
			t.Fatalf("stderr %q", errb.String())
		}
	})
}
