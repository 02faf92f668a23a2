package commit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Issue 36 (review): node 1's trainer never joins. Node 0 says so early,
// naming the missing ranks and the time left, rather than waiting out its
// deadline without a word; and when no other node's agent ever took part
// in the run (no part lease but its own), it gives up at once.
func TestCommitParts_WaitSaysWhatIsMissing(t *testing.T) {
	defer func(d time.Duration) { partsWarnAfter = d }(partsWarnAfter)
	partsWarnAfter = 0 // at the first listing

	commit := func(t *testing.T, ctx context.Context, st cloud.Store, log *zap.Logger) error {
		req := partRequest(t, twoNodes[0], 30, "cccccccccccc")
		_, err := (&Committer{Store: st, RunID: "run", Log: log}).Commit(ctx, req)
		return err
	}
	t.Run("NoOtherAgent", func(t *testing.T) {
		st := cptest.NewStore(t)
		if _, err := checkpoint.AcquirePartLease(t.Context(), st, "node-0", checkpoint.LeaseRecord{Session: "s0"}); err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zap.WarnLevel)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a deadline it must not wait out
		defer cancel()
		err := commit(t, ctx, st, zap.New(core))
		if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "no other node's agent") || !strings.Contains(err.Error(), "[2 3]") {
			t.Fatalf("err=%v, want ErrIncomplete: no other node's agent, ranks [2 3]", err)
		}
		w := logs.FilterMessage("job checkpoint still waiting for the other nodes' parts").All()
		if len(w) != 1 {
			t.Fatalf("%d warnings, want 1", len(w))
		}
		if f := w[0].ContextMap(); f["left_s"].(float64) < 30 || len(f["other_nodes_leased"].([]any)) != 0 {
			t.Fatalf("warning fields %v, want left_s of about a minute and no other node", f)
		}
	})
	t.Run("OtherAgentSilent", func(t *testing.T) {
		st := cptest.NewStore(t)
		if _, err := checkpoint.AcquirePartLease(t.Context(), st, "node-1", checkpoint.LeaseRecord{Session: "s1"}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		core, logs := observer.New(zap.WarnLevel)
		// The warning is the event the test waits for; then the commit's
		// context ends as its deadline would.
		hooked := zapcore.RegisterHooks(core, func(e zapcore.Entry) error {
			if e.Message == "job checkpoint still waiting for the other nodes' parts" {
				cancel()
			}
			return nil
		})
		err := commit(t, ctx, st, zap.New(hooked))
		if !errors.Is(err, ErrIncomplete) || strings.Contains(err.Error(), "no other node's agent") {
			t.Fatalf("err=%v, want ErrIncomplete at the context's end", err)
		}
		w := logs.FilterMessage("job checkpoint still waiting for the other nodes' parts").All()
		if len(w) != 1 {
			t.Fatalf("%d warnings, want 1", len(w))
		}
		f := w[0].ContextMap()
		if got := fmt.Sprint(f["missing_ranks"]); got != "[2 3]" {
			t.Fatalf("missing_ranks %v, want [2 3]", got)
		}
		if got := f["other_nodes_leased"].([]any); len(got) != 1 || got[0] != "node-1" {
			t.Fatalf("other_nodes_leased %v, want [node-1]", got)
		}
	})
}
