package s3

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// bufPool hands out part buffers under one byte budget shared by every Put
// of a store. While uploads run, buffers of the standard part size are kept
// and reused, never left to the GC: dropping 16 MiB slices would let the
// heap (and RSS) grow to twice the budget between collections. When the
// last buffer comes back the idle ones are let go, so that an agent between
// checkpoints (or a node agent with many runs, one store each) does not
// hold the whole budget for nothing.
type bufPool struct {
	sem    *semaphore.Weighted
	budget int64
	part   int64 // size of the reusable buffers

	mu    sync.Mutex
	free  [][]byte
	inUse int // buffers handed out and not yet returned
}

func newBufPool(budget, part int64) *bufPool {
	return &bufPool{sem: semaphore.NewWeighted(budget), budget: budget, part: part}
}

// get waits until n bytes of the budget are free and returns a buffer of
// length n; release it with put. n above the budget waits for the whole
// budget (one such part at a time).
func (p *bufPool) get(ctx context.Context, n int64) ([]byte, error) {
	if err := p.sem.Acquire(ctx, min(n, p.budget)); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse++
	if n == p.part && len(p.free) > 0 {
		b := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		return b, nil
	}
	if n > p.part {
		// A grown part (objects > 10,000 standard parts): drop the idle
		// buffers so that kept plus new memory stays near the budget.
		p.free = nil
	}
	return make([]byte, n), nil
}

// put returns a buffer from get, with its length unchanged.
func (p *bufPool) put(b []byte) {
	n := int64(len(b))
	p.mu.Lock()
	p.inUse--
	switch {
	case p.inUse == 0:
		p.free = nil // idle: the GC and the scavenger give it back
	case n == p.part:
		p.free = append(p.free, b)
	}
	p.mu.Unlock()
	p.sem.Release(min(n, p.budget))
}

// idle reports the buffers kept for reuse (for tests).
func (p *bufPool) idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}
