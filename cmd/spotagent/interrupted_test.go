package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Issue #37, "Interruptions are never counted failures": node 0 of a
// two-node job whose other node never answers (so the stop's job
// checkpoint cannot commit) is stopped for a shutdown (SIGTERM). Its two
// ranks are real Python trainers of the spotagent client under a shell
// launcher that exits 1 when a rank failed, as torchrun does. The ranks
// take the stop's checkpoint request as the save whose collective loses
// the other node, catch the error and exit 1 (as training scripts that
// catch exceptions do: nothing in the exit file); the launcher exits 1.
// The agent exits 75: an interruption is not the job's bug. When a rank
// had crashed before the stop (a native crash: no bye, no exit file), the
// same launcher exit stays 1. The agent runs in-process (execute): the
// SIGTERM's relay to the launcher and the exit code are the supervisor's,
// as in the binary (end to end until #49).

// launcherRankArgs make the fake trainer a rank that trains until the
// agent asks for a checkpoint, which it answers as a save whose collective
// lost the other node: it exits 1 (sys.exit, as an uncaught exception
// does). With --crash-file (rank 0, when the test crashes it first) it
// crashes natively (os._exit(1)) once that file exists.
var launcherRankArgs = []string{"--step-time", "0.02", "--on", "exit:1"}

// launcherStopSh starts the node's two ranks and exits 1 when one of them
// failed, as torchrun does.
const launcherStopSh = `export WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=2
RANK=0 LOCAL_RANK=0 $TRAINER $RANK0_ARGS & a=$!
RANK=1 LOCAL_RANK=1 $TRAINER & b=$!
wait $a; ra=$?; wait $b; rb=$?
echo "launcher: ranks exited $ra and $rb"
[ "$ra" = 0 ] && [ "$rb" = 0 ] || exit 1
`

func TestInterrupted_LauncherOneAfterStopIs75(t *testing.T) {
	for _, tc := range []struct {
		name          string
		crashedBefore bool
		want          int
		log           string
	}{
		{"no crash", false, 75, "trainer exited 1 during the job's stop and no rank crashed before it: exiting 75 (an interruption is not the job's bug)"},
		{"rank crashed before the stop", true, 1, "trainer exited 1 during the stop, after a rank of this node crashed before it: exiting 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortTempDir(t)
			// In-process the launcher's output (its ranks' with it) would
			// be this test binary's: it goes to a file instead.
			out := filepath.Join(dir, "launcher.out")
			launcher := filepath.Join(dir, "launcher.sh")
			if err := os.WriteFile(launcher, []byte("exec >'"+out+"' 2>&1\n"+launcherStopSh), 0o755); err != nil {
				t.Fatal(err)
			}
			trigger := filepath.Join(dir, "crash")
			t.Setenv("TRAINER", strings.Join(fakeTrainer(t, launcherRankArgs...), " "))
			t.Setenv("PYTHONUNBUFFERED", "1")
			t.Setenv("RANK0_ARGS", "")
			if tc.crashedBefore {
				t.Setenv("RANK0_ARGS", "--crash-file "+trigger)
			}
			// Node 1 never comes: no heartbeats to wait for, and no job
			// checkpoint can commit.
			a := startStoppedAtEnd(t, "run", "--store", "file://"+filepath.Join(dir, "store"), "--run-id", "it",
				"--checkpoint-dir", filepath.Join(dir, "n0"), "--socket", filepath.Join(dir, "n0.sock"),
				"--cloud", "none", "--log-format", "json", "--node-rank", "0",
				"--interval", "1h", "--term-grace", "20s", "--peer-timeout", "0", "--", "/bin/sh", launcher)
			fileLine(t, out, `trainer: connected .*rank=0\b`, time.Minute)
			fileLine(t, out, `trainer: connected .*rank=1\b`, time.Minute)
			if tc.crashedBefore {
				if err := os.WriteFile(trigger, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				a.entryWithin(t, "a rank of this node ended on an error", time.Minute, nil)
			}
			sigtermSelf(t)                                          // the shutdown stop
			code := a.waitWithin(t, 2*time.Minute)                  // the stop waits for the launcher
			fileLine(t, out, `launcher: ranks exited`, time.Second) // reaped with the agent's exit
			if code != tc.want {
				t.Fatalf("agent exited %d, want %d\n%s\n%s", code, tc.want, a.stderr.String(), testutil.ReadFile(t, out))
			}
			a.entry(t, tc.log)
		})
	}
}
