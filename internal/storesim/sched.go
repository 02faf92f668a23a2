package storesim

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing/synctest"
	"time"
)

// Errors the scheduler injects.
var (
	ErrInjected = errors.New("injected fault")
	ErrLost     = errors.New("injected fault: reply lost, the operation happened")
	ErrCrashed  = errors.New("process died")
)

// Sched is a Faults that runs actors (sessions, nodes, retention) one
// operation at a time in an order drawn from one seed, so that a schedule
// replays exactly. Each actor is a goroutine, but only one runs at a time:
// an actor runs until its next store operation (or Sleep), where it waits;
// once every actor waits or has ended, the scheduler picks one (from the
// seed), decides that operation's fate (go ahead, fail, lose the reply,
// or the actor's process dies) and lets it run to its next operation.
//
// For that to be deterministic without Bubble, the code an actor runs must
// make its store calls from one goroutine at a time (a committer with
// Concurrency 1, a restore of one file at a time); goroutines that never
// touch the store (progress logs) do not matter. With Bubble (the
// schedule runs inside a testing/synctest bubble) an actor may have
// several goroutines in flight, each with an operation of its own (a
// committer's concurrent uploads, a restore's concurrent downloads): the
// scheduler waits until every goroutine of the bubble is parked
// (synctest.Wait) and picks among every parked operation, ordered by
// actor then operation, so the choice does not depend on which goroutine
// parked first. Operations whose context carries no actor (an oracle's
// reads, a background context) pass straight through, without faults:
// the actor that made them is the one running.
type Sched struct {
	rng  *rand.Rand
	mu   sync.Mutex
	cond *sync.Cond
	// actors in the order they were added; running counts those not
	// waiting and not ended.
	actors  []*Actor
	waiters []*waiter // parked operations, in the order they parked
	running int
	steps   int

	// Bubble: the schedule runs inside a synctest bubble (synctest.Test),
	// and actors may run several goroutines at once (see above). Each
	// step also advances the bubble's clock by a millisecond, so that
	// times the code records are ordered as the schedule orders them.
	Bubble bool

	// Rates of faults per operation, drawn against the seed.
	FailRate, LostRate, CrashRate float64
	// MaxSteps ends a schedule that runs too long: every actor left dies.
	MaxSteps int
	// Trace records every step: actor, operation, fate.
	Trace []string
	// Check, when set, is called with each operation just before it runs
	// (ran false) and once it ran (ran true, with err its result), while
	// every other actor waits: the place for invariants about single
	// operations.
	Check func(a *Actor, op Op, ran bool, err error)
}

// Actor is one process of a schedule.
type Actor struct {
	Name   string
	s      *Sched
	idx    int // its place in s.actors: the first key of the pick order
	ctx    context.Context
	cancel context.CancelFunc
	dead   bool
	ended  bool
	lost   map[string]bool // operations (Op.String) whose reply is lost
	// Data is the caller's, for Check.
	Data any
}

// waiter is one parked operation of an actor's goroutine.
type waiter struct {
	a     *Actor
	op    Op
	grant chan fate
}

type fate int

const (
	fateGo fate = iota
	fateFail
	fateLost
	fateCrash
)

type actorKey struct{}

// NewSched returns a scheduler drawing from seed.
func NewSched(seed uint64) *Sched {
	s := &Sched{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), MaxSteps: 10000}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Rand is the scheduler's random source, for the caller to draw a
// schedule's shape from before Run (not while actors run).
func (s *Sched) Rand() *rand.Rand { return s.rng }

// ActorOf returns the actor whose context ctx derives from, or nil.
func ActorOf(ctx context.Context) *Actor {
	a, _ := ctx.Value(actorKey{}).(*Actor)
	return a
}

// Go adds an actor running fn. It starts when the scheduler first picks
// it (its start is a step of the schedule), during Run.
func (s *Sched) Go(name string, data any, fn func(ctx context.Context)) *Actor {
	a := &Actor{Name: name, s: s, Data: data, lost: map[string]bool{}}
	a.ctx, a.cancel = context.WithCancel(context.WithValue(context.Background(), actorKey{}, a))
	s.mu.Lock()
	a.idx = len(s.actors)
	s.actors = append(s.actors, a)
	s.running++
	s.mu.Unlock()
	go func() {
		defer func() {
			a.cancel()
			s.mu.Lock()
			a.ended = true
			s.running--
			s.cond.Broadcast()
			s.mu.Unlock()
		}()
		if a.yield(Op{Kind: "start"}) != nil {
			return
		}
		fn(a.ctx)
	}()
	return a
}

// Dead reports whether the actor's process died.
func (a *Actor) Dead() bool {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return a.dead
}

// yield waits for the scheduler to pick a and returns what becomes of op.
func (a *Actor) yield(op Op) error {
	s := a.s
	s.mu.Lock()
	if a.dead {
		s.mu.Unlock()
		return ErrCrashed
	}
	w := &waiter{a: a, op: op, grant: make(chan fate, 1)}
	s.waiters = append(s.waiters, w)
	s.running--
	s.cond.Broadcast()
	s.mu.Unlock()
	switch <-w.grant {
	case fateFail:
		return ErrInjected
	case fateCrash:
		return ErrCrashed
	case fateLost:
		s.mu.Lock()
		a.lost[lostKey(op)] = true
		s.mu.Unlock()
	}
	return nil
}

// lostKey is op as the lost-reply flag knows it: an actor never has two
// of the same in flight.
func lostKey(op Op) string { return op.String() }

// settle waits until no goroutine of an actor runs: every one parked at
// an operation, ended, or (Bubble) durably blocked elsewhere.
func (s *Sched) settle() {
	if s.Bubble {
		synctest.Wait()
		return
	}
	s.mu.Lock()
	for s.running > 0 {
		s.cond.Wait()
	}
	s.mu.Unlock()
}

// waiting reports whether some actor has not ended (s.mu held).
func (s *Sched) waiting() bool {
	for _, a := range s.actors {
		if !a.ended {
			return true
		}
	}
	return false
}

// ready is the parked operations in the order picks index (s.mu held):
// by actor, then by operation; not by when they parked.
func (s *Sched) ready() []*waiter {
	ready := slices.Clone(s.waiters)
	slices.SortStableFunc(ready, func(x, y *waiter) int {
		if c := cmp.Compare(x.a.idx, y.a.idx); c != 0 {
			return c
		}
		if c := cmp.Compare(x.op.Kind, y.op.Kind); c != 0 {
			return c
		}
		if c := cmp.Compare(x.op.Key, y.op.Key); c != 0 {
			return c
		}
		return bytes.Compare(x.op.Body, y.op.Body)
	})
	return ready
}

// Run runs the schedule until every actor ended. It returns an error when
// MaxSteps ran out (every actor left was killed).
func (s *Sched) Run() error {
	var err error
	for {
		if s.Bubble {
			time.Sleep(time.Millisecond) // the bubble's clock: one step
		}
		s.settle()
		s.mu.Lock()
		if len(s.waiters) == 0 {
			if s.Bubble && s.waiting() {
				// An actor waits on something else (a timer): blocking
				// here lets the bubble's clock run to it.
				s.cond.Wait()
				s.mu.Unlock()
				continue
			}
			s.mu.Unlock()
			return err
		}
		ready := s.ready()
		w := ready[s.rng.IntN(len(ready))]
		a := w.a
		f := fateGo
		s.steps++
		if s.steps > s.MaxSteps {
			f = fateCrash
			err = fmt.Errorf("schedule ran past %d steps", s.MaxSteps)
		} else if w.op.Kind != "start" {
			switch x := s.rng.Float64(); {
			case x < s.CrashRate:
				f = fateCrash
			case x < s.CrashRate+s.FailRate:
				f = fateFail
			case x < s.CrashRate+s.FailRate+s.LostRate && (w.op.Kind == OpPut || w.op.Kind == OpDelete):
				f = fateLost
			}
		}
		grants := []*waiter{w}
		if f == fateCrash {
			a.dead = true
			// The process is gone: its other goroutines' operations
			// fail with it.
			for _, o := range ready {
				if o.a == a && o != w {
					grants = append(grants, o)
				}
			}
		}
		s.waiters = slices.DeleteFunc(s.waiters, func(o *waiter) bool { return slices.Contains(grants, o) })
		s.running += len(grants)
		s.Trace = append(s.Trace, fmt.Sprintf("%d %s %s: %s", s.steps, a.Name, w.op, [...]string{"go", "fail", "lost reply", "crash"}[f]))
		s.mu.Unlock()
		if f == fateCrash {
			a.cancel() // whatever it runs now fails
		}
		w.grant <- f
		for _, o := range grants[1:] {
			o.grant <- fateCrash
		}
	}
}

// Before holds op until the scheduler picks its actor; see Faults.
func (s *Sched) Before(ctx context.Context, op Op) error {
	a := ActorOf(ctx)
	if a == nil {
		return nil
	}
	if err := a.yield(op); err != nil {
		return err
	}
	if s.Check != nil {
		s.Check(a, op, false, nil)
	}
	return nil
}

// After reports a lost reply as a failure; see Faults.
func (s *Sched) After(ctx context.Context, op Op, err error) error {
	a := ActorOf(ctx)
	if a == nil {
		return err
	}
	if s.Check != nil {
		s.Check(a, op, true, err)
	}
	s.mu.Lock()
	lost := a.lost[lostKey(op)]
	delete(a.lost, lostKey(op))
	s.mu.Unlock()
	if lost && err == nil {
		return ErrLost
	}
	return err
}

// Sleep is a step of the schedule in place of a real wait (a poll's
// back-off): the other actors run meanwhile. Without an actor in ctx it
// sleeps for real.
func Sleep(ctx context.Context, d time.Duration) error {
	a := ActorOf(ctx)
	if a == nil {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	if err := a.yield(Op{Kind: "sleep"}); err != nil {
		return err
	}
	return ctx.Err()
}

// TraceSince returns the steps from the i-th on (a copy): what happened
// while an actor did something, for a check to look at.
func (s *Sched) TraceSince(i int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.Trace[min(i, len(s.Trace)):])
}

// TraceLen is the number of steps so far.
func (s *Sched) TraceLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.Trace)
}
