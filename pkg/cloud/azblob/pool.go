package azblob

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// bufPool hands out block buffers under one byte budget, shared by every
// store of the process with the same block size and budget (a node agent
// serving many runs), as the S3 store's pool does. Standard-size buffers
// are kept in a sync.Pool between blocks, so a long upload reuses them;
// the GC frees them once uploads stop.
type bufPool struct {
	sem    *semaphore.Weighted
	budget int64
	block  int64
	free   sync.Pool
}

var (
	poolsMu sync.Mutex
	pools   = map[[2]int64]*bufPool{}
)

func sharedPool(budget, block int64) *bufPool {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	k := [2]int64{budget, block}
	if p := pools[k]; p != nil {
		return p
	}
	p := &bufPool{sem: semaphore.NewWeighted(budget), budget: budget, block: block}
	pools[k] = p
	return p
}

// get waits until n bytes of the budget are free and returns a buffer of
// length n; give it back with put.
func (p *bufPool) get(ctx context.Context, n int64) ([]byte, error) {
	if err := p.sem.Acquire(ctx, min(n, p.budget)); err != nil {
		return nil, err
	}
	if n == p.block {
		if b, ok := p.free.Get().(*[]byte); ok {
			return *b, nil
		}
	}
	return make([]byte, n), nil
}

// put gives back a buffer from get, possibly resliced shorter.
// drop releases b's share of the budget without reusing b: a request
// that failed may still be read by the transport (attempts).
func (p *bufPool) drop(b []byte) { p.sem.Release(min(int64(cap(b)), p.budget)) }

func (p *bufPool) put(b []byte) {
	n := int64(cap(b))
	if n == p.block {
		b = b[:n]
		p.free.Put(&b)
	}
	p.sem.Release(min(n, p.budget))
}
