package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
)

// stopJob is node 0 of a two-node job under a launcher that exits 1 once
// told to (the trigger file), as torchrun does when its ranks failed, or
// its store's host vanished, before the stop's deadline.
type stopJob struct {
	launcherJob
	trigger string
	logs    *observer.ObservedLogs
}

func startStopJob(t *testing.T) *stopJob {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	dir := testutil.ShortDir(t)
	info, trigger := filepath.Join(dir, "info"), filepath.Join(dir, "trigger")
	ar := startAgent(t, func(c *Config) {
		c.Node, c.Log, c.Liveness.Timeout = NodePart(0), zap.New(core), -1
		c.Command = launcherCommand(info, `while [ ! -e `+trigger+` ]; do sleep 0.05; done; exit 1`)
	})
	return &stopJob{launcherJob: *joinLauncher(t, ar, info), trigger: trigger, logs: logs}
}

// #37 item 4: the job's shutdown stop runs (SIGTERM) and the other node
// vanishes meanwhile: the ranks here never answer, exit 1 on their own
// (nothing in the exit file) and the launcher exits 1 before the stop's
// deadline. An interruption is not the job's bug: 75. A rank that crashed
// before the stop keeps it a crash: 1.
func TestAgent_StopLauncherOneIs75UnlessCrashedBefore(t *testing.T) {
	for _, crashedBefore := range []bool{false, true} {
		t.Run("crashed_before="+strconv.FormatBool(crashedBefore), func(t *testing.T) {
			j := startStopJob(t)
			if crashedBefore {
				j.end(t, 0, "1")
				testutil.WaitFor(t, "the crash verdict", func() bool {
					return j.logs.FilterMessage("a rank of this node ended on an error").Len() > 0
				})
			}
			j.ar.sigs <- syscall.SIGTERM
			testutil.WaitFor(t, "the stop", func() bool {
				return j.logs.FilterMessage("signal received: taking a final checkpoint").Len() > 0
			})
			for r := range j.conns {
				if crashedBefore && r == 0 {
					continue
				}
				j.end(t, r, "") // exit 1 on their own: no exit file
			}
			if err := os.WriteFile(j.trigger, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			want := ExitInterrupted
			if crashedBefore {
				want = 1
			}
			if code, _ := j.exits(t); code != want {
				t.Fatalf("exit code %d, want %d", code, want)
			}
		})
	}
}
