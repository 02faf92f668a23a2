package s3

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// waitFor is testutil.WaitFor (the module's one bounded wait).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, what, cond)
}

// TestBufPool_ReusesWhileBusyDropsWhenIdle: standard buffers are reused
// while any is out, kept across a short idle gap, and let go (with their
// memory handed back: release) once the pool has stayed idle for linger.
func TestBufPool_ReusesWhileBusyDropsWhenIdle(t *testing.T) {
	ctx := context.Background()
	p := newBufPool(4<<10, 1<<10)
	var released atomic.Int32
	p.release = func() { released.Add(1) }
	p.linger = time.Hour // drained by hand below
	a, _ := p.get(ctx, 1<<10)
	b, _ := p.get(ctx, 1<<10)
	p.put(a)
	if p.idle() != 1 {
		t.Fatalf("idle=%d while b is out, want 1 (a kept)", p.idle())
	}
	c, _ := p.get(ctx, 1<<10)
	if &c[0] != &a[0] {
		t.Fatal("a busy pool allocated instead of reusing the idle buffer")
	}
	p.put(c)
	p.put(b)
	if p.idle() != 2 {
		t.Fatalf("idle=%d just after the last put, want 2 (kept for the next file)", p.idle())
	}
	// A stale timer (a get came since) does nothing.
	p.mu.Lock()
	stale := p.epoch - 1
	p.mu.Unlock()
	p.drain(stale)
	if p.idle() != 2 || released.Load() != 0 {
		t.Fatalf("a stale drain dropped buffers: idle=%d released=%d", p.idle(), released.Load())
	}
	d, _ := p.get(ctx, 1<<10) // the next upload, within linger, reuses them
	if &d[0] != &a[0] && &d[0] != &b[0] {
		t.Fatal("an upload within linger allocated instead of reusing the kept buffers")
	}
	p.put(d)

	p.linger = time.Millisecond
	e, _ := p.get(ctx, 1<<10)
	p.put(e) // arms the timer with the short linger
	waitFor(t, "the idle buffers to be let go", func() bool { return p.idle() == 0 && released.Load() == 1 })
	// The budget is whole again: four buffers at once.
	for range 4 {
		if _, err := p.get(ctx, 1<<10); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedPool_OneBudgetForAllStores: stores with the same part size and
// budget (a node agent's runs) draw part buffers from one budget, not one
// each: once one store holds the whole budget, another gets nothing.
func TestSharedPool_OneBudgetForAllStores(t *testing.T) {
	ctx := context.Background()
	opts := Options{Endpoint: "http://127.0.0.1:1", Region: "us-east-1", PartSize: 5 << 20, BufferMemory: 15 << 20}
	a, err := New(ctx, "bucket-a", "", opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(ctx, "bucket-b", "run-2", opts)
	if err != nil {
		t.Fatal(err)
	}
	if a.pool != b.pool {
		t.Fatal("two stores with the same options have their own part budgets")
	}
	var held [][]byte
	for range 3 {
		buf, err := a.pool.get(ctx, 5<<20)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, buf)
	}
	if b.pool.sem.TryAcquire(1) {
		t.Fatal("store b got part memory while store a holds the whole shared budget")
	}
	a.pool.put(held[0])
	buf, err := b.pool.get(ctx, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	if &buf[0] != &held[0][0] {
		t.Fatal("store b allocated instead of reusing the buffer store a gave back")
	}
	b.pool.put(buf)
	for _, h := range held[1:] {
		a.pool.put(h)
	}
	other, err := New(ctx, "bucket-c", "", Options{Endpoint: "http://127.0.0.1:1", Region: "us-east-1", PartSize: 6 << 20, BufferMemory: 15 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if other.pool == a.pool {
		t.Fatal("a store with another part size shares the pool")
	}
}

// TestBufPool_CollectsDuringLongUploads: every gcEvery bytes of parts
// put back, the pool starts a collection, so that the garbage of a long
// upload does not pile up to twice the budget before the GC's own goal.
func TestBufPool_CollectsDuringLongUploads(t *testing.T) {
	ctx := context.Background()
	p := newBufPool(4<<10, 1<<10)
	var collected atomic.Int32
	p.collect = func() { collected.Add(1) }
	p.gcEvery = 8 << 10
	held, _ := p.get(ctx, 1<<10) // an upload in progress
	for range 7 {
		b, _ := p.get(ctx, 1<<10)
		p.put(b)
	}
	if collected.Load() != 0 {
		t.Fatalf("collected after 7 KiB of parts, want none before 8 KiB")
	}
	b, _ := p.get(ctx, 1<<10)
	p.put(b)
	waitFor(t, "a collection after 8 KiB of parts", func() bool { return collected.Load() == 1 })
	p.put(held)
}

// idle reports the buffers kept for reuse .
func (p *bufPool) idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}
