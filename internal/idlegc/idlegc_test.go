package idlegc

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// gogc is the GOGC in force, from runtime/metrics.
func gogc(t *testing.T) int {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("runtime/metrics has no /gc/gogc:percent")
	}
	return int(s[0].Value.Uint64())
}

// waitGOGC runs collections until GOGC is want, with a deadline; between
// them it calls work (the load the tuner judges). The deadline is a
// minute: the tuner runs on the finalizer goroutine after each
// collection, which a loaded 2-core machine under -race can starve for
// seconds (10 s failed once beside a full make test).
func waitGOGC(t *testing.T, want int, work func()) {
	t.Helper()
	const within = time.Minute
	deadline := time.Now().Add(within)
	for gogc(t) != want {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC=%d after %s, want %d", gogc(t), within, want)
		}
		work()
		runtime.GC()
	}
}

var sink []byte

func TestStart(t *testing.T) {
	t.Setenv("GOGC", "")
	before := gogc(t)
	stop := Start()
	if got, want := gogc(t), IdlePercent; got != want {
		t.Fatalf("GOGC=%d after Start, want %d", got, want)
	}
	// Busy: far more than BusyRate between collections.
	waitGOGC(t, before, func() {
		for range 64 {
			sink = make([]byte, 1<<20)
		}
	})
	// Idle again: collections with next to nothing allocated in between.
	waitGOGC(t, IdlePercent, func() { time.Sleep(100 * time.Millisecond) })
	stop()
	if got := gogc(t); got != before {
		t.Fatalf("GOGC=%d after stop, want %d", got, before)
	}
	runtime.GC() // a sentinel armed before stop must not lower it again
	runtime.GC()
	if got := gogc(t); got != before {
		t.Fatalf("GOGC=%d after stop and two collections, want %d", got, before)
	}
}

func TestStartKeepsUserGOGC(t *testing.T) {
	t.Setenv("GOGC", "100")
	before := gogc(t)
	stop := Start()
	defer stop()
	if got := gogc(t); got != before {
		t.Fatalf("GOGC=%d with GOGC set in the environment, want %d", got, before)
	}
}
