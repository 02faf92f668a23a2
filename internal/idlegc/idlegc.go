// Package idlegc keeps the Go heap of an idle daemon small.
//
// The collector's heap goal is live × (1 + GOGC/100), but never below
// 4 MiB × GOGC/100. An idle agent holds ~1.5 MiB live and allocates
// ~0.1 MB/s while it polls metadata, so at the default GOGC its heap grows
// to the 4 MiB floor between collections and the runtime keeps those pages:
// ~2.5 MiB of the idle RSS is garbage waiting for a collection.
//
// Start lowers GOGC to IdlePercent (floor 1 MiB, goal 1.25 × live) while
// the process is idle, and puts the previous value back as soon as it is
// not. Idle is decided after every collection from the bytes allocated since
// the previous one: up to BusyRate per second is idle. A checkpoint, a
// restore or any burst of work allocates far more than that, so at most one
// or two small collections run at the idle setting before the next one
// restores GOGC; the transfers then run at the default. At idle the
// collector runs every ~5–10 s instead of every ~25 s, each cycle ~1–2 ms of
// CPU on a heap this small.
package idlegc

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

const (
	// IdlePercent is GOGC while the process is idle.
	IdlePercent = 25
	// BusyRate is the allocation rate, in bytes per second averaged over
	// one collection cycle, above which the process is busy.
	BusyRate = 1 << 20
)

// allocsMetric is the cumulative count of bytes allocated on the heap.
const allocsMetric = "/gc/heap/allocs:bytes"

// tuner is driven by the finalizer of a sentinel object: the runtime runs
// it after the collection that found the sentinel unreachable, and the
// callback arms a new one. While busy, a timer also looks again after
// recheck: at the default GOGC an agent that turned idle right after a
// burst (start-up, a checkpoint) would otherwise wait ~25 s for the next
// collection. mu guards everything below it.
type tuner struct {
	busy  int // GOGC in force when Start was called
	timer *time.Timer

	mu         sync.Mutex
	stopped    bool
	cur        int // GOGC set by the tuner
	sample     []metrics.Sample
	lastAllocs uint64    // allocated bytes at the last collection
	lastAt     time.Time // and when it ended
}

// recheck is how long after a busy verdict the timer looks again.
const recheck = 5 * time.Second

// sentinel has a pointer so that it is never a tiny allocation (tiny
// blocks are freed together, late).
type sentinel struct{ _ *byte }

// Start lowers GOGC while the process is idle, as the package comment
// says, and returns a func that stops doing so and restores the previous
// GOGC. It does nothing when GOGC is set in the environment (the user's
// choice stands) or when the collector is off.
func Start() (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	busy := debug.SetGCPercent(IdlePercent)
	if busy < 0 {
		debug.SetGCPercent(busy)
		return func() {}
	}
	t := &tuner{busy: busy, cur: IdlePercent, sample: []metrics.Sample{{Name: allocsMetric}}}
	t.lastAllocs, t.lastAt = t.allocs(), time.Now()
	t.timer = time.AfterFunc(time.Hour, t.afterQuiet)
	t.timer.Stop()
	t.arm()
	return t.stop
}

func (t *tuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		t.timer.Stop()
		debug.SetGCPercent(t.busy)
	}
}

func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) { t.afterGC() })
}

// allocs reads the heap's allocated bytes; mu held.
func (t *tuner) allocs() uint64 {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return t.sample[0].Value.Uint64()
}

// rate is the allocation rate since the last collection; mu held.
func (t *tuner) rate(now time.Time) (float64, uint64) {
	allocs := t.allocs()
	return float64(allocs-t.lastAllocs) / max(now.Sub(t.lastAt).Seconds(), 1e-3), allocs
}

// set puts GOGC to the idle or the busy value; mu held.
func (t *tuner) set(idle bool) {
	want := t.busy
	if idle {
		want = IdlePercent
		t.timer.Stop()
	} else {
		t.timer.Reset(recheck)
	}
	if want != t.cur {
		debug.SetGCPercent(want)
		t.cur = want
	}
}

// afterGC sets GOGC from the allocation rate over the cycle that just
// ended, then arms the next sentinel.
func (t *tuner) afterGC() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	now := time.Now()
	r, allocs := t.rate(now)
	t.lastAllocs, t.lastAt = allocs, now
	t.set(r <= BusyRate)
	t.arm()
}

// afterQuiet, recheck after a busy verdict, turns idle when little was
// allocated since the last collection.
func (t *tuner) afterQuiet() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped || t.cur != t.busy {
		return
	}
	if r, _ := t.rate(time.Now()); r <= BusyRate {
		t.set(true)
	} else {
		t.timer.Reset(recheck)
	}
}
