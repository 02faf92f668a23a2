package ranks

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/liveness"
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
	w := NewWatch(Env{Log: zap.NewNop(), Metrics: nopMetrics{}})
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

type nopMetrics struct{}

func (nopMetrics) Error(string) {}
