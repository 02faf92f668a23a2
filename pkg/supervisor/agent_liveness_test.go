package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/ranks"
)

// startSilentPeerJob is node 0 of a two-node job (launcherJob) with the
// liveness heartbeats on, and node 1's agent as a bare liveness monitor
// on the same store; it returns once each has heard the other.
func startSilentPeerJob(t *testing.T) (*launcherJob, *liveness.Monitor, context.CancelFunc, *observer.ObservedLogs) {
	t.Helper()
	return startSilentPeerLauncher(t, `while :; do sleep 0.05; done`, nil)
}

// startSilentPeerLauncher is startSilentPeerJob with a launcher that runs
// then after starting its ranks (launcherCommand), and mutate applied to
// the agent's Config.
func startSilentPeerLauncher(t *testing.T, then string, mutate func(*Config)) (*launcherJob, *liveness.Monitor, context.CancelFunc, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	lc := liveness.Config{Listen: "127.0.0.1:0", Advertise: []string{"127.0.0.1"}, Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond}
	info := filepath.Join(testutil.ShortDir(t), "info")
	ar := startAgent(t, func(c *Config) {
		c.Command = launcherCommand(info, then)
		c.Node, c.Liveness, c.Log = NodePart(0), lc, zap.New(core)
		if mutate != nil {
			mutate(c)
		}
	})
	j := joinLauncher(t, ar, info)
	ctx, cancel := context.WithCancel(context.Background())
	peer := lc
	peer.Store, peer.RunID, peer.Node, peer.Nodes, peer.Session = j.ar.store, j.ar.cfg.RunID, 1, 2, "peer-session"
	m, err := liveness.Start(ctx, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	testutil.WaitFor(t, "node 0's agent to hear node 1", func() bool { return logs.FilterMessage("liveness: a neighbour heard").Len() > 0 })
	return j, m, cancel, logs
}

// A neighbour that stops answering (its machine stopped: no leave, no
// RST) is a lost peer: the agent ends its ranks and the launcher, and
// exits 75.
func TestAgent_SilentPeerEndsRanksAndExits75(t *testing.T) {
	j, _, vanish, logs := startSilentPeerJob(t)
	vanish()
	if code, took := j.exits(t); code != ExitInterrupted {
		t.Fatalf("exit code %d %s after node 1 went silent, want %d", code, took, ExitInterrupted)
	}
	if logs.FilterMessage("a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks").Len() != 1 {
		t.Fatal("the silent neighbour was not the reason")
	}
}

// Issue 51: after a silent neighbour's verdict the launcher, whose ranks
// all exited on the agent's SIGTERM, is SIGKILLed at once rather than
// waited for: this launcher answers SIGTERM with ten minutes of work (as
// torchrun unwinds and prints its traceback, only slower), and
// --kill-after is three times the test's wait, so only the agent's SIGKILL
// once the ranks are gone lets it exit 75 in time (without it the test
// fails at testutil.Wait, and ends at --kill-after).
func TestAgent_SilentPeerKillsLauncherOnceRanksGone(t *testing.T) {
	j, _, vanish, logs := startSilentPeerLauncher(t, `trap 'sleep 600' TERM; while :; do sleep 0.05; done`,
		func(c *Config) { c.KillAfter = 3 * testutil.Wait })
	vanish()
	if code, took := j.exits(t); code != ExitInterrupted {
		t.Fatalf("exit code %d %s after node 1 went silent, want %d", code, took, ExitInterrupted)
	}
	for _, msg := range []string{
		"a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks",
		"every rank of this node has exited after a silent neighbour's verdict: killing the launcher rather than wait for its own exit",
	} {
		if n := logs.FilterMessage(msg).Len(); n != 1 {
			t.Errorf("%q logged %d times, want once", msg, n)
		}
	}
	for _, pid := range j.pids {
		if child.Alive(pid) {
			t.Errorf("rank %d still runs", pid)
		}
	}
}

// A neighbour whose agent leaves in order (it exits) is no loss.
func TestAgent_PeerThatLeavesIsNoLoss(t *testing.T) {
	j, m, _, logs := startSilentPeerJob(t)
	m.Close()
	testutil.WaitFor(t, "the leave", func() bool { return logs.FilterMessage("liveness: a neighbour's agent left in order").Len() > 0 })
	left := time.Now()
	testutil.WaitFor(t, "the timeout to pass", func() bool { return time.Since(left) > time.Second })
	select {
	case code := <-j.ar.done:
		t.Fatalf("agent exited %d after its neighbour left in order", code)
	default:
	}
}

// A sidecar cannot signal the trainer container: on a silent neighbour it
// creates peer-lost beside its socket, where the trainer's script looks.
// A symlink planted there is not written through.
func TestAgent_SidecarSilentPeerTellsTrainer(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("symlink=%v", planted), func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			lc := liveness.Config{Listen: "127.0.0.1:0", Advertise: []string{"127.0.0.1"}, Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond}
			ar := startAgent(t, func(c *Config) { c.Node, c.Liveness, c.Log = NodePart(0), lc, zap.New(core) })
			lost := filepath.Join(filepath.Dir(ar.cfg.Server.Path), ranks.PeerLostFile)
			target := filepath.Join(testutil.ShortDir(t), "target")
			if planted {
				testutil.WriteFile(t, target, "mine")
				if err := os.Symlink(target, lost); err != nil {
					t.Fatal(err)
				}
			}
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": 0, "world_size": 2, "local_world_size": 1,
				"node_rank": 0, "nodes": 2})
			tr.Expect(protocol.TypeWelcome)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			peer := lc
			peer.Store, peer.RunID, peer.Node, peer.Nodes, peer.Session = ar.store, ar.cfg.RunID, 1, 2, "peer-session"
			if _, err := liveness.Start(ctx, peer); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, "the sidecar to hear node 1", func() bool { return logs.FilterMessage("liveness: a neighbour heard").Len() > 0 })
			cancel()
			if planted {
				testutil.WaitFor(t, "the silence", func() bool {
					return logs.FilterMessageSnippet("a neighbour node's agent is silent").Len() > 0
				})
				if b, _ := os.ReadFile(target); string(b) != "mine" {
					t.Fatalf("written through the planted symlink: %q", b)
				}
				return
			}
			testutil.WaitFor(t, "peer-lost beside the socket", func() bool {
				b, err := os.ReadFile(lost)
				return err == nil && string(b) == "75\n"
			})
		})
	}
}
