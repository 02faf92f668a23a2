package s3

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// bufPool hands out part buffers under one byte budget. Stores opened with
// the same part size and budget share one pool (sharedPool), so that every
// upload of the process (a node agent serving many runs, one store each)
// stays within one budget rather than one per store.
//
// While uploads run, buffers of the standard part size are kept and reused,
// never left to the GC: dropping 16 MiB slices would let the heap (and RSS)
// grow to twice the budget between collections. Once no buffer has been
// out for linger, the idle ones are let go and their memory is handed back
// to the OS at once (release: debug.FreeOSMemory), so that an agent between
// checkpoints holds nothing, and the next checkpoint's new buffers do not
// pile up on top of the old ones that the GC has not yet collected (that
// doubled the agent's peak RSS when it dropped them the moment an upload
// ended). The linger keeps the buffers across the short gaps between the
// files of one checkpoint.
//
// A long upload makes a little garbage per part (the SDK's request state,
// ~150 KB), and with the buffers live the GC's next goal is twice the budget:
// over a 4 GiB checkpoint the heap grew by 50 MiB of garbage before any
// collection came. Every gcEvery bytes of parts the pool starts one
// (collect: runtime.GC, in the background; it costs a few ms, the buffers
// hold no pointers), which keeps that garbage to a few MiB.
type bufPool struct {
	sem     *semaphore.Weighted
	budget  int64
	part    int64         // size of the reusable buffers
	linger  time.Duration // idle time before the kept buffers are let go
	release func()        // after idle buffers are dropped
	gcEvery int64         // bytes of parts between two collect calls
	collect func()
	cycled  int64       // bytes of parts put back since the last collect; under mu
	running atomic.Bool // a collect is under way

	mu    sync.Mutex
	free  [][]byte
	inUse int // buffers handed out and not yet returned
	timer *time.Timer
	epoch int // counts gets, so that a stale timer does nothing
}

// poolLinger: how long idle part buffers are kept for the next upload.
const poolLinger = 3 * time.Second

func newBufPool(budget, part int64) *bufPool {
	return &bufPool{sem: semaphore.NewWeighted(budget), budget: budget, part: part, linger: poolLinger, release: debug.FreeOSMemory,
		gcEvery: 4 * budget, collect: runtime.GC}
}

var (
	poolsMu sync.Mutex
	pools   = map[[2]int64]*bufPool{}
)

// sharedPool is the process's pool for this budget and part size.
func sharedPool(budget, part int64) *bufPool {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	k := [2]int64{budget, part}
	p := pools[k]
	if p == nil {
		p = newBufPool(budget, part)
		pools[k] = p
	}
	return p
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
	p.epoch++
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
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
	if n == p.part {
		p.free = append(p.free, b)
	}
	if p.inUse == 0 && len(p.free) > 0 && p.timer == nil {
		epoch := p.epoch
		p.timer = time.AfterFunc(p.linger, func() { p.drain(epoch) })
	}
	p.cycled += n
	gc := p.cycled >= p.gcEvery && p.collect != nil
	if gc {
		p.cycled = 0
	}
	p.mu.Unlock()
	if gc && p.running.CompareAndSwap(false, true) {
		go func() {
			defer p.running.Store(false)
			p.collect()
		}()
	}
	p.sem.Release(min(n, p.budget))
}

// drain lets the idle buffers go if no get came since the timer was set
// (epoch), and hands their memory back to the OS.
func (p *bufPool) drain(epoch int) {
	p.mu.Lock()
	if p.epoch != epoch || p.inUse > 0 || len(p.free) == 0 {
		p.mu.Unlock()
		return
	}
	p.free, p.timer = nil, nil
	p.mu.Unlock()
	if p.release != nil {
		p.release()
	}
}
