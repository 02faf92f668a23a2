package commit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrPreempted ends a periodic commit whose upload slot an interruption
// checkpoint needed.
var ErrPreempted = errors.New("upload preempted by an interruption checkpoint")

// Gate lets a few commits at a time onto the network, for the runs of one
// node agent. One notice reaches every run at once and their uploads race
// one deadline: shared evenly, the bandwidth can make every run miss it.
// The gate lets the most urgent through first (interruption commits before
// periodic ones, then the earliest deadline, then the smallest checkpoint,
// then the first to ask), so that as many runs as possible commit in time.
// A periodic commit holding a slot is cancelled (ErrPreempted) when an
// interruption commit waits for one.
type Gate struct {
	mu      sync.Mutex
	slots   int
	held    map[*ticket]bool
	waiting []*ticket
	seq     uint64
}

// Claim describes the commit asking for a slot.
type Claim struct {
	Urgent   bool      // an interruption or shutdown checkpoint
	Deadline time.Time // zero: none
	Bytes    int64
}

type ticket struct {
	Claim
	seq       uint64
	ready     chan struct{}
	preempt   context.CancelCauseFunc
	preempted bool
}

// NewGate returns a gate with slots commits at a time (at least one).
func NewGate(slots int) *Gate {
	return &Gate{slots: max(slots, 1), held: map[*ticket]bool{}}
}

// Acquire waits for a slot. The commit runs under the returned context,
// which ends if the commit is preempted (context.Cause is ErrPreempted),
// and calls release when it is done. An error means ctx ended first.
// The slot is freed as soon as the commit's context ends (cancelled,
// preempted, past its deadline), even if the commit has not returned yet:
// one stuck commit must not hold up every other run of the node.
func (g *Gate) Acquire(ctx context.Context, c Claim) (context.Context, func(), error) {
	uctx, cancel := context.WithCancelCause(ctx)
	g.mu.Lock()
	g.seq++
	t := &ticket{Claim: c, seq: g.seq, ready: make(chan struct{}), preempt: cancel}
	g.waiting = append(g.waiting, t)
	g.dispatch()
	if c.Urgent && !g.held[t] {
		g.preempt()
	}
	g.mu.Unlock()
	var once sync.Once
	free := func() {
		once.Do(func() {
			g.mu.Lock()
			delete(g.held, t)
			g.dispatch()
			g.mu.Unlock()
		})
	}
	select {
	case <-t.ready:
		stop := context.AfterFunc(uctx, free)
		return uctx, func() { stop(); free(); cancel(nil) }, nil
	case <-ctx.Done():
		g.mu.Lock()
		if g.held[t] { // admitted while ctx ended
			delete(g.held, t)
		} else {
			g.remove(t)
		}
		g.dispatch()
		g.mu.Unlock()
		cancel(nil)
		return nil, nil, ctx.Err()
	}
}

// Waiting is the number of commits waiting for a slot.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

// dispatch admits the best waiters while slots are free. g.mu is held.
func (g *Gate) dispatch() {
	for len(g.held) < g.slots && len(g.waiting) > 0 {
		best := g.waiting[0]
		for _, t := range g.waiting[1:] {
			if t.before(best) {
				best = t
			}
		}
		g.remove(best)
		g.held[best] = true
		close(best.ready)
	}
}

// preempt cancels periodic holders, the latest deadline first, until
// every urgent waiter has a slot on its way: a holder already preempted and
// not yet released counts as one. g.mu is held; a slot frees when its
// commit's context ends (at once, here) or the commit releases it.
func (g *Gate) preempt() {
	urgent, leaving := 0, 0
	for _, t := range g.waiting {
		if t.Urgent {
			urgent++
		}
	}
	for t := range g.held {
		if t.preempted {
			leaving++
		}
	}
	for ; leaving < urgent; leaving++ {
		var victim *ticket
		for t := range g.held {
			if !t.Urgent && !t.preempted && (victim == nil || victim.before(t)) {
				victim = t
			}
		}
		if victim == nil {
			return
		}
		victim.preempted = true
		victim.preempt(ErrPreempted)
	}
}

func (g *Gate) remove(t *ticket) {
	for i, w := range g.waiting {
		if w == t {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

// before orders tickets: urgent first, then the earliest deadline (none is
// last), then the fewest bytes, then the first to ask.
func (t *ticket) before(o *ticket) bool {
	if t.Urgent != o.Urgent {
		return t.Urgent
	}
	if !t.Deadline.Equal(o.Deadline) {
		if t.Deadline.IsZero() || o.Deadline.IsZero() {
			return o.Deadline.IsZero()
		}
		return t.Deadline.Before(o.Deadline)
	}
	if t.Bytes != o.Bytes {
		return t.Bytes < o.Bytes
	}
	return t.seq < o.seq
}
