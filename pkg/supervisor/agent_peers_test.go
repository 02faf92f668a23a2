package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/ranks"
)

// launcherJob is a stand-in for torchrun under the agent: a shell that
// starts two "ranks" (sleeps in its group), says where their pids and its
// exit file are, and then waits forever, as torchrun waits in its exit
// barrier for a node that vanished. The test speaks for the ranks on the
// socket (hello with their pids) and ends them as the scenario says.
type launcherJob struct {
	ar       *agentRun
	pids     []int
	conns    []*trainertest.Trainer
	exitFile string
}

func startLauncherJob(t *testing.T, mutate func(*Config)) *launcherJob {
	t.Helper()
	info := filepath.Join(testutil.ShortDir(t), "info")
	ar := startAgent(t, func(c *Config) {
		c.Command = launcherCommand(info, `while :; do sleep 0.05; done`)
		if mutate != nil {
			mutate(c)
		}
	})
	return joinLauncher(t, ar, info)
}

// launcherCommand starts two "ranks", writes their pids and the exit
// file's path to info, then runs then.
func launcherCommand(info, then string) []string {
	return []string{"/bin/sh", "-c", `sleep 600 & a=$!; sleep 600 & b=$!; ` +
		`echo "$a $b $SPOTAGENT_EXIT_FILE" > ` + info + `.tmp; mv ` + info + `.tmp ` + info + `; ` + then}
}

// joinLauncher waits for the launcher's info file, then says hello on the
// socket for each of its ranks (ranks 0 and 1 of 4, node 0 of 2).
func joinLauncher(t *testing.T, ar *agentRun, info string) *launcherJob {
	t.Helper()
	var f []string
	testutil.WaitFor(t, "the launcher's ranks", func() bool {
		b, err := os.ReadFile(info)
		f = strings.Fields(string(b))
		return err == nil && len(f) == 3
	})
	j := &launcherJob{ar: ar, exitFile: f[2]}
	for r, s := range f[:2] {
		pid, _ := strconv.Atoi(s)
		j.pids = append(j.pids, pid)
		tr := trainertest.Dial(t, ar.cfg.Server.Path)
		tr.Send(map[string]any{"type": "hello", "pid": pid, "rank": r, "world_size": 4, "local_world_size": 2,
			"node_rank": 0, "nodes": 2})
		tr.Expect(protocol.TypeWelcome)
		j.conns = append(j.conns, tr)
	}
	return j
}

// end ends rank r's process as a rank does: writes the exit file (if
// write is not empty), closes its connection, exits.
func (j *launcherJob) end(t *testing.T, r int, write string) {
	t.Helper()
	if write != "" {
		if _, err := os.Stat(j.exitFile); err != nil { // the client's first answer stands
			os.WriteFile(j.exitFile, []byte(write+"\n"), 0o644)
		}
	}
	j.conns[r].Close()
	syscall.Kill(j.pids[r], syscall.SIGKILL)
}

// exits waits for the agent's exit code; the launcher, which never ends
// on its own, must have been ended by the agent.
func (j *launcherJob) exits(t *testing.T) (int, time.Duration) {
	t.Helper()
	t0 := time.Now()
	return j.ar.wait(t), time.Since(t0)
}

// Both ranks of this node lost a peer (75 in the exit file before they
// left): once their processes are gone the agent ends the launcher (no
// 300 s barrier) and exits 75, not the launcher's code.
func TestAgent_LostPeerEndsLauncherAndExits75(t *testing.T) {
	j := startLauncherJob(t, nil)
	j.end(t, 0, "75")
	j.end(t, 1, "75")
	if code, took := j.exits(t); code != ExitInterrupted {
		t.Fatalf("exit code %d after the ranks lost a peer (%s), want %d", code, took, ExitInterrupted)
	}
}

// A rank that crashed on its own leaves first: 1 in the exit file, or
// nothing (killed by the OOM killer); its local peer then says 75. The
// launcher is ended all the same, and the agent exits 1.
func TestAgent_CrashFirstKeepsLauncherCode(t *testing.T) {
	for _, first := range []string{"1", ""} {
		t.Run("first="+first, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			j := startLauncherJob(t, func(c *Config) { c.Log = zap.New(core) })
			j.end(t, 0, first)
			// The peer fails a moment later, once the agent took note.
			testutil.WaitFor(t, "the agent's verdict", func() bool {
				return logs.FilterMessage("a rank of this node ended on an error").Len() > 0
			})
			j.end(t, 1, "75")
			// The launcher (never ending on its own) was ended by the
			// agent's SIGTERM: 143, reported as the crash it is, 1.
			if code, _ := j.exits(t); code != 1 {
				t.Fatalf("exit code %d after a rank crashed on its own, want 1", code)
			}
		})
	}
}

// Ranks that said bye finished: the launcher is left alone (its barrier
// waits for the other nodes to finish, as it should).
func TestAgent_FinishedRanksLeaveLauncherAlone(t *testing.T) {
	j := startLauncherJob(t, nil)
	for r := range j.conns {
		j.conns[r].Send(map[string]any{"type": "bye", "step": 10})
		j.end(t, r, "")
	}
	select {
	case code := <-j.ar.done:
		t.Fatalf("agent exited %d: it ended the launcher of ranks that finished", code)
	case <-time.After(2 * time.Second): // the verdict would come within rankPoll of the ranks' exit
	}
}

// Part mode: a crash record of another node of this incarnation of the
// job means the lost peer crashed on its own: the launcher's code stands
// on this node too, so that a bug counts as a failure on every node.
func TestAgent_LostPeerThatCrashedIsNo75(t *testing.T) {
	for _, crashed := range []bool{false, true} {
		t.Run("crashed="+strconv.FormatBool(crashed), func(t *testing.T) {
			j := startLauncherJob(t, func(c *Config) { c.Node = NodePart(0) })
			if crashed {
				rec := `{"node":"node-1","session":"x"}`
				if err := j.ar.store.Put(context.Background(), ranks.CrashDir+"node-1-x.json", strings.NewReader(rec), int64(len(rec)), cloud.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			j.end(t, 0, "75")
			j.end(t, 1, "75")
			code, took := j.exits(t)
			if want := map[bool]bool{false: true, true: false}[crashed]; (code == ExitInterrupted) != want {
				t.Fatalf("exit code %d (crash record of node-1: %v)", code, crashed)
			}
			if took < ranks.PeerCrashSettle-time.Second {
				t.Errorf("decided %s after the ranks' exit, before the other nodes' crash records could land (%s)", took, ranks.PeerCrashSettle)
			}
		})
	}
}

// A crash in part mode records itself for the other nodes.
func TestAgent_CrashIsRecordedForTheOtherNodes(t *testing.T) {
	j := startLauncherJob(t, func(c *Config) { c.Node = NodePart(1) })
	j.end(t, 0, "1")
	j.end(t, 1, "75")
	j.exits(t)
	var keys []string
	j.ar.store.List(context.Background(), ranks.CrashDir, func(o cloud.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	})
	if len(keys) != 1 || !strings.HasPrefix(keys[0], ranks.CrashDir+"node-1-") {
		t.Fatalf("crash records %v, want one of node-1", keys)
	}
}

// TestExitFileSays_TrainerReplacedIt: the trainer can replace the exit
// file. A symlink (to a file the agent may read and the trainer may not)
// is not followed, a FIFO does not block the loop, and only the first
// bytes count.
func TestExitFileSays_TrainerReplacedIt(t *testing.T) {
	dir := testutil.ShortDir(t)
	secret, p := filepath.Join(dir, "secret"), filepath.Join(dir, "exit")
	testutil.WriteFile(t, secret, "75\n")
	t.Setenv(localdirs.ExitFileEnv, p)
	a := &Agent{}
	testutil.WriteFile(t, p, " 75\n")
	if got := a.dirs.ExitFileSays(); got != "75" {
		t.Fatalf("regular file: %q, want 75", got)
	}
	os.Remove(p)
	if err := os.Symlink(secret, p); err != nil {
		t.Fatal(err)
	}
	if got := a.dirs.ExitFileSays(); got != "" {
		t.Fatalf("a symlink was followed: %q", got)
	}
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() { said <- a.dirs.ExitFileSays() }()
	select {
	case got := <-said:
		if got != "" {
			t.Fatalf("a FIFO: %q", got)
		}
	case <-time.After(testutil.Wait):
		t.Fatal("reading a FIFO at the exit file's path blocked")
	}
}
