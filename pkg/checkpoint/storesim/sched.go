package storesim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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
// For that to be deterministic the code an actor runs must make its store
// calls from one goroutine at a time (a committer with Concurrency 1, a
// restore of one file at a time); goroutines that never touch the store
// (progress logs) do not matter. Operations whose context carries no actor
// (an oracle's reads, a background context) pass straight through, without
// faults: the actor that made them is the one running.
type Sched struct {
	rng  *rand.Rand
	mu   sync.Mutex
	cond *sync.Cond
	// actors in the order they were added; running counts those not
	// waiting and not ended.
	actors  []*Actor
	running int
	steps   int

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
	ctx    context.Context
	cancel context.CancelFunc
	grant  chan fate
	op     Op
	wait   bool
	dead   bool
	ended  bool
	lost   bool // the current operation's reply is lost
	// Data is the caller's, for Check.
	Data any
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
	a := &Actor{Name: name, s: s, grant: make(chan fate), Data: data}
	a.ctx, a.cancel = context.WithCancel(context.WithValue(context.Background(), actorKey{}, a))
	s.mu.Lock()
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
	a.op, a.wait = op, true
	s.running--
	s.cond.Broadcast()
	s.mu.Unlock()
	switch <-a.grant {
	case fateFail:
		return ErrInjected
	case fateCrash:
		return ErrCrashed
	case fateLost:
		a.lost = true
	}
	return nil
}

// Run runs the schedule until every actor ended. It returns an error when
// MaxSteps ran out (every actor left was killed).
func (s *Sched) Run() error {
	var err error
	for {
		s.mu.Lock()
		for s.running > 0 {
			s.cond.Wait()
		}
		var ready []*Actor
		for _, a := range s.actors {
			if a.wait {
				ready = append(ready, a)
			}
		}
		if len(ready) == 0 {
			s.mu.Unlock()
			return err
		}
		a := ready[s.rng.IntN(len(ready))]
		f := fateGo
		s.steps++
		if s.steps > s.MaxSteps {
			f = fateCrash
			err = fmt.Errorf("schedule ran past %d steps", s.MaxSteps)
		} else if a.op.Kind != "start" {
			switch x := s.rng.Float64(); {
			case x < s.CrashRate:
				f = fateCrash
			case x < s.CrashRate+s.FailRate:
				f = fateFail
			case x < s.CrashRate+s.FailRate+s.LostRate && (a.op.Kind == OpPut || a.op.Kind == OpDelete):
				f = fateLost
			}
		}
		if f == fateCrash {
			a.dead = true
		}
		a.wait = false
		s.running++
		s.Trace = append(s.Trace, fmt.Sprintf("%d %s %s: %s", s.steps, a.Name, a.op, [...]string{"go", "fail", "lost reply", "crash"}[f]))
		s.mu.Unlock()
		if f == fateCrash {
			a.cancel() // the process is gone: whatever it runs now fails
		}
		a.grant <- f
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
	if a.lost {
		a.lost = false
		if err == nil {
			return ErrLost
		}
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
