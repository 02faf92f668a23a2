package ranks

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestPeerCrashed_BesideTheLoop (issue 35 item 2): the lookup for another
// node's crash record ends with its context, settle or not (the agent's
// end cancels it), and finds another node's record of this session's
// time, never this node's own.
func TestPeerCrashed_BesideTheLoop(t *testing.T) {
	st, err := file.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := peerCrashed(ctx, st, "node-0", time.Now(), time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled lookup: %v, want context.Canceled", err)
	}
	since := time.Now()
	put := func(key string) {
		t.Helper()
		if err := st.Put(t.Context(), key, strings.NewReader("{}"), 2, cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(CrashDir + "node-0-s1.json") // this node's own
	if key, err := peerCrashed(t.Context(), st, "node-0", since, time.Now()); err != nil || key != "" {
		t.Fatalf("own record only: %q, %v; want none", key, err)
	}
	put(CrashDir + "node-1-s2.json")
	if key, err := peerCrashed(t.Context(), st, "node-0", since, time.Now()); err != nil || key != CrashDir+"node-1-s2.json" {
		t.Fatalf("another node's record: %q, %v", key, err)
	}
}

// A silent neighbour's verdict looks for crash records at once (its agent
// cannot be writing one); the ranks' own verdict waits PeerCrashSettle
// for the crashed node's record to land.
func TestSettleAt_SilentPeerDoesNotWait(t *testing.T) {
	w := NewTracker(Env{Log: zap.NewNop(), Metrics: nopMetrics{}})
	if !w.OnPeerSilent(liveness.Silence{Node: 1, Session: "s", Since: time.Now().Add(-2 * time.Second)}, true, false) {
		t.Fatal("a silent neighbour while the ranks train did not end them")
	}
	if got := w.settleAt(); !got.Equal(w.verdictAt) {
		t.Fatalf("silent neighbour: lookup %v after the verdict, want at once", got.Sub(w.verdictAt))
	}
	w.Reset()
	w.verdict, w.verdictAt = verdictPeerLost, time.Now() // the ranks' RSTs (Tick)
	if got := w.settleAt(); got.Sub(w.verdictAt) != PeerCrashSettle {
		t.Fatalf("ranks' verdict: lookup %v after it, want %v", got.Sub(w.verdictAt), PeerCrashSettle)
	}
}

// startRanks starts n processes that stand for ranks, said hello to w,
// and returns them (killed at the test's end).
func startRanks(t *testing.T, w *Tracker, n int) []*exec.Cmd {
	t.Helper()
	var cmds []*exec.Cmd
	for range n {
		c := exec.Command("sleep", "600")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		ws := 4
		w.Hello(protocol.Message{PID: c.Process.Pid, WorldSize: &ws}, true)
		cmds = append(cmds, c)
	}
	return cmds
}

// Issue 51: after a silent neighbour's verdict, Tick asks for the
// launcher's SIGKILL once every rank is gone, once; never while a rank
// runs, and never during a stop sequence (a notice's or a signal's stop
// lets torchrun exit in order).
func TestTick_SilentVerdictKillsLauncherOnceRanksGone(t *testing.T) {
	w := NewTracker(Env{Log: zap.NewNop(), Metrics: nopMetrics{}})
	rs := startRanks(t, &w, 2)
	if !w.OnPeerSilent(liveness.Silence{Node: 1, Session: "s", Since: time.Now().Add(-2 * time.Second)}, true, false) {
		t.Fatal("a silent neighbour while the ranks train did not end them")
	}
	if !w.Pending(true, false) {
		t.Fatal("not pending after a silent verdict: the loop would not look at the ranks again")
	}
	if a := w.Tick(time.Now(), true, false); a != None {
		t.Fatalf("both ranks run: Tick %v, want None", a)
	}
	rs[0].Process.Kill()
	rs[0].Wait()
	if a := w.Tick(time.Now(), true, false); a != None {
		t.Fatalf("one rank runs: Tick %v, want None", a)
	}
	rs[1].Process.Kill()
	rs[1].Wait()
	if a := w.Tick(time.Now(), true, true); a != None {
		t.Fatalf("ranks gone during a stop sequence: Tick %v, want None (the stop ends the launcher)", a)
	}
	if a := w.Tick(time.Now(), true, false); a != KillLauncher {
		t.Fatalf("ranks gone: Tick %v, want KillLauncher", a)
	}
	if a := w.Tick(time.Now(), true, false); a != None || w.Pending(true, false) {
		t.Fatalf("after the kill: Tick %v, pending %v; want None, not pending (once)", a, w.Pending(true, false))
	}
	if code := w.PeerLossExit(128 + int(syscall.SIGKILL)); code != 1 || !w.Looking() {
		t.Fatalf("the SIGKILLed launcher: code %d, looking %v; want 1 until the crash-record lookup says 75", code, w.Looking())
	}
}

// The ranks' own lost-peer verdict (RSTs) ends the launcher with SIGTERM
// (EndLauncher) and never SIGKILLs it early: there the crash-record wait
// (PeerCrashSettle) outlasts torchrun's exit anyway.
func TestTick_RanksVerdictEndsLauncherWithoutKill(t *testing.T) {
	w := NewTracker(Env{Log: zap.NewNop(), Metrics: nopMetrics{}})
	rs := startRanks(t, &w, 2)
	for _, r := range rs {
		r.Process.Kill()
		r.Wait()
	}
	w.exitFile = func() string { return "75" }
	w.left = map[int]string{rs[0].Process.Pid: "75"}
	w.leftAt = map[int]time.Time{rs[0].Process.Pid: time.Now()}
	w.order = []int{rs[0].Process.Pid}
	if a := w.Tick(time.Now(), true, false); a != EndLauncher || !w.PeerLost() {
		t.Fatalf("every rank gone after a lost peer: Tick %v, peer lost %v; want EndLauncher, true", a, w.PeerLost())
	}
	if a := w.Tick(time.Now(), true, false); a != None || w.Pending(true, false) {
		t.Fatalf("after EndLauncher: Tick %v, pending %v; want None, not pending", a, w.Pending(true, false))
	}
}

type nopMetrics struct{}

func (nopMetrics) Error(string) {}
