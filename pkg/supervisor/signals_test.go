package supervisor

// The start-up's signals (startSignals, restore.go) and a signal as a
// shutdown notice (signalNotice, stop.go).

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metadata"
)

func TestStart_SignalDuringStartCancelsIt(t *testing.T) {
	signals := make(chan os.Signal, 4)
	ctx, loop, started, stop := startSignals(context.Background(), signals, nil)
	defer stop()
	signals <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(testutil.Wait):
		t.Fatal("a signal during the start did not cancel it")
	}
	if got := started(); got != syscall.SIGTERM {
		t.Fatalf("started() = %v, want SIGTERM", got)
	}
	select {
	case s := <-loop:
		t.Fatalf("a signal of the start reached the loop: %v", s)
	default:
	}
}

func TestStart_SignalsAfterTheStartGoToTheLoop(t *testing.T) {
	signals := make(chan os.Signal, 4)
	ctx, loop, started, stop := startSignals(context.Background(), signals, nil)
	defer stop()
	if got := started(); got != nil {
		t.Fatalf("started() = %v with no signal", got)
	}
	signals <- syscall.SIGINT
	select {
	case s := <-loop:
		if s != syscall.SIGINT {
			t.Fatalf("loop got %v, want SIGINT", s)
		}
	case <-time.After(testutil.Wait):
		t.Fatal("the signal did not reach the loop")
	}
	if ctx.Err() != nil {
		t.Fatal("a signal after the start cancelled the agent's context")
	}
}

func TestNotice_ShutdownWithTheGrace(t *testing.T) {
	n := signalNotice(syscall.SIGTERM, 30*time.Second)
	if n.Cloud != metadata.CloudSignal || n.Kind != metadata.KindTermination || n.ID != "signal-SIGTERM" || n.Action != "SIGTERM" {
		t.Fatalf("notice %+v", n)
	}
	if got := n.Deadline.Sub(n.Detected); got != 30*time.Second {
		t.Fatalf("deadline %v after detection, want the grace 30s", got)
	}
	if n := signalNotice(syscall.SIGINT, 0); n.ID != "signal-"+syscall.SIGINT.String() {
		t.Fatalf("SIGINT notice id %q", n.ID)
	}
}
