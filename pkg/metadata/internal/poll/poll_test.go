package poll

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// TestDedup: a notice read twice is delivered once; the same ID of
// another kind is another notice.
func TestDedup(t *testing.T) {
	var d Dedup
	n := metadata.Notice{Kind: metadata.KindTermination, ID: "a"}
	if d.Seen(n.Kind, n.ID) || !d.First(n) {
		t.Fatal("a new notice: want not seen, first")
	}
	if d.First(n) || !d.Seen(n.Kind, n.ID) {
		t.Fatal("the same notice again: want seen, not first")
	}
	if !d.First(metadata.Notice{Kind: metadata.KindRebalance, ID: "a"}) {
		t.Fatal("the same ID, another kind: want first")
	}
}

func TestHashID(t *testing.T) {
	a, b := HashID("gcp", []byte("x")), HashID("gcp", []byte("y"))
	if a == b || a != HashID("gcp", []byte("x")) || len(a) != len("gcp-")+16 {
		t.Fatalf("HashID: %q, %q: want stable, distinct, prefix + 16 hex digits", a, b)
	}
}

// TestDeliver: sent when the reader takes it; not sent once ctx ends.
func TestDeliver(t *testing.T) {
	out := make(chan metadata.Notice, 1)
	if !Deliver(context.Background(), out, metadata.Notice{ID: "1"}) || (<-out).ID != "1" {
		t.Fatal("Deliver to a free channel: want sent")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Deliver(ctx, make(chan metadata.Notice), metadata.Notice{ID: "2"}) {
		t.Fatal("Deliver with ctx ended and no reader: want not sent")
	}
}

// TestFaultLog: failures 1, 2, 4, 8 in a row are logged, the others not;
// the recovery once, and the count starts over.
func TestFaultLog(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f := NewFaultLog(zap.New(core), "poll")
	for range 9 {
		f.Fail(errors.New("refused"))
	}
	var counts []int64
	for _, e := range logs.FilterMessage("poll failed").All() {
		counts = append(counts, e.ContextMap()["failures_in_a_row"].(int64))
	}
	if len(counts) != 4 || counts[0] != 1 || counts[1] != 2 || counts[2] != 4 || counts[3] != 8 {
		t.Fatalf("logged failures at %v, want [1 2 4 8]", counts)
	}
	f.OK()
	f.OK()
	if n := logs.FilterMessage("poll recovered").Len(); n != 1 {
		t.Fatalf("%d recoveries logged, want 1", n)
	}
	f.Fail(errors.New("again"))
	if n := logs.FilterMessage("poll failed").Len(); n != 5 {
		t.Fatalf("first failure after a recovery: %d failures logged, want 5", n)
	}
}
