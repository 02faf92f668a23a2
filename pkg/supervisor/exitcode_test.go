package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/watch"
)

// TestExitCodes_FinishedIsNeverRerun (issue 36 item 7): every stop reason
// maps to one agent exit code (docs/protocol.md "Exit codes"). A trainer
// that finished (bye, or exit 0 before anything told it to stop) makes
// the agent exit 0, also when a SIGTERM came meanwhile: before, it exited
// 75 and systemd or the Job ran a completed job again. A trainer the
// agent told to stop, or stopped itself, is to be continued: 75.
func TestExitCodes_FinishedIsNeverRerun(t *testing.T) {
	type cell struct {
		name  string
		watch bool
		// before the SIGTERM: bye (and disconnect), or a trainer that
		// stays connected; after it: whether the trainer waits for the
		// stop message before it exits.
		bye, awaitStop bool
		exit, want     int
	}
	for _, tc := range []cell{
		{name: "run: bye, then SIGTERM, exit 0", bye: true, exit: 0, want: 0},
		{name: "run: bye, then SIGTERM, exit 3", bye: true, exit: 3, want: 3},
		{name: "run: SIGTERM, exit 0 before the stop", exit: 0, want: 0},
		{name: "run: SIGTERM, stop, exit 0", awaitStop: true, exit: 0, want: ExitInterrupted},
		{name: "run: SIGTERM, stop, exit 75", awaitStop: true, exit: ExitInterrupted, want: ExitInterrupted},
		{name: "run: SIGTERM, stop, exit 3", awaitStop: true, exit: 3, want: 3},
		{name: "watch: SIGTERM, exit 0 on its own", watch: true, exit: 0, want: 0},
		{name: "watch: SIGTERM, exit 75 on its own", watch: true, exit: ExitInterrupted, want: ExitInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := filepath.Join(testutil.ShortDir(t), "release")
			ar := startAgent(t, func(c *Config) {
				c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; exit " + strconv.Itoa(tc.exit)}
				c.TermGrace = time.Minute // the trainer's exit, not the deadline, ends these runs
				if tc.watch {
					c.FenceInterval = -1
					c.Watch = &WatchConfig{Config: watch.Config{Dir: t.TempDir(), Quiet: 200 * time.Millisecond}}
				}
			})
			ar.waitStatus(t, "the trainer running", func(s Status) bool { return s.Child != nil && s.Child.Running })
			var tr *trainertest.Trainer
			if !tc.watch {
				tr = trainertest.Dial(t, ar.cfg.Server.Path)
				tr.Hello()
				if tc.bye {
					tr.Send(map[string]any{"type": "bye", "step": 5})
					tr.Close()
					ar.waitStatus(t, "the trainer gone", func(s Status) bool { return s.Trainers == 0 })
				}
			}
			ar.sigs <- syscall.SIGTERM
			ar.waitStatus(t, "the shutdown under way", func(s Status) bool { return s.Stopping == protocol.ReasonShutdown })
			if tc.awaitStop {
				tr.Save(tr.Expect(protocol.TypeCheckpoint), 5, "w")
				tr.Expect(protocol.TypeCommitted)
				if s := tr.Expect(protocol.TypeStop); s.Reason != protocol.ReasonShutdown {
					t.Fatalf("stop=%+v", s)
				}
			}
			os.WriteFile(release, nil, 0o600)
			if got := ar.wait(t); got != tc.want {
				t.Fatalf("exit code %d, want %d", got, tc.want)
			}
		})
	}
}

// TestExitCodes_SidecarShutdown: a sidecar's shutdown checkpoint commits,
// its trainer is told to stop (the trainer exits 75 itself) and leaves;
// the sidecar exits 0 (docs/protocol.md "Exit codes": a sidecar never
// exits 75, only 76 when fenced: TestAgent_Fenced).
func TestExitCodes_SidecarShutdown(t *testing.T) {
	ar := startAgent(t, nil) // no command: a sidecar
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	tr.Save(tr.Expect(protocol.TypeCheckpoint), 5, "w")
	tr.Expect(protocol.TypeCommitted)
	if s := tr.Expect(protocol.TypeStop); s.Reason != protocol.ReasonShutdown {
		t.Fatalf("stop=%+v", s)
	}
	tr.Close()
	if got := ar.wait(t); got != 0 {
		t.Fatalf("sidecar exit code %d, want 0", got)
	}
}

// TestExitCodes_RunFenced (issue 36 item 1, agent side): under `spotagent
// run`, a fenced trainer that exits 0 (as the Python client did before it
// learnt 76) or 76 still makes the agent exit 76, never 0 or 75.
func TestExitCodes_RunFenced(t *testing.T) {
	for _, exit := range []int{0, exitFenced, ExitInterrupted} {
		t.Run(strconv.Itoa(exit), func(t *testing.T) {
			release := filepath.Join(testutil.ShortDir(t), "release")
			ar := startAgent(t, func(c *Config) {
				c.FenceInterval = 20 * time.Millisecond
				c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; exit " + strconv.Itoa(exit)}
			})
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			if _, err := checkpoint.AcquireLease(context.Background(), ar.store, checkpoint.LeaseRecord{Session: "newer"}); err != nil {
				t.Fatal(err)
			}
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 7, "w")
			tr.Expect(protocol.TypeUploadFailed)
			if s := tr.Expect(protocol.TypeStop); s.Reason != reasonFenced {
				t.Fatalf("stop=%+v, want reason fenced", s)
			}
			os.WriteFile(release, nil, 0o600)
			if got := ar.wait(t); got != exitFenced {
				t.Fatalf("exit code %d, want %d", got, exitFenced)
			}
		})
	}
}

// TestExitCodes_WatchFenced: in --watch mode a newer session's lease
// fences the agent; it stops its trainer and exits 76, whatever the
// trainer's own code.
func TestExitCodes_WatchFenced(t *testing.T) {
	ar := startAgent(t, func(c *Config) {
		c.FenceInterval = 20 * time.Millisecond
		c.Command = []string{"/bin/sh", "-c", "sleep 60"}
		c.Watch = &WatchConfig{Config: watch.Config{Dir: t.TempDir(), Quiet: 200 * time.Millisecond}}
	})
	ar.waitStatus(t, "the trainer running", func(s Status) bool { return s.Child != nil && s.Child.Running })
	if _, err := checkpoint.AcquireLease(context.Background(), ar.store, checkpoint.LeaseRecord{Session: "newer"}); err != nil {
		t.Fatal(err)
	}
	if got := ar.wait(t); got != exitFenced {
		t.Fatalf("exit code %d, want %d", got, exitFenced)
	}
}
