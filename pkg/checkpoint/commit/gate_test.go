package commit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

const gateWait = 10 * time.Second

// waitGate waits until n commits wait at g.
func waitGate(t *testing.T, g *Gate, n int) {
	t.Helper()
	deadline := time.Now().Add(gateWait)
	for g.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting=%d, want %d", g.Waiting(), n)
		}
		time.Sleep(time.Millisecond) // polling a condition, bounded by deadline
	}
}

// TestGate_Order: with one slot, waiters go urgent first, then the earliest
// deadline, then the smallest, then the first to ask.
func TestGate_Order(t *testing.T) {
	g := NewGate(1)
	now := time.Now()
	_, release, err := g.Acquire(context.Background(), Claim{Urgent: true})
	if err != nil {
		t.Fatal(err)
	}
	claims := []struct {
		name string
		c    Claim
	}{
		{"periodic", Claim{Deadline: now.Add(time.Minute), Bytes: 1}},
		{"urgent-late", Claim{Urgent: true, Deadline: now.Add(time.Hour), Bytes: 1}},
		{"urgent-none", Claim{Urgent: true, Bytes: 1}},
		{"urgent-early-big", Claim{Urgent: true, Deadline: now.Add(time.Minute), Bytes: 100}},
		{"urgent-early-small", Claim{Urgent: true, Deadline: now.Add(time.Minute), Bytes: 10}},
		{"urgent-early-small-2nd", Claim{Urgent: true, Deadline: now.Add(time.Minute), Bytes: 10}},
	}
	var (
		mu  sync.Mutex
		got []string
		wg  sync.WaitGroup
	)
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, rel, err := g.Acquire(context.Background(), c.c)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, c.name)
			mu.Unlock()
			rel()
		}()
		waitGate(t, g, i+1) // one at a time, so that "first to ask" is defined
	}
	release()
	wg.Wait()
	want := []string{"urgent-early-small", "urgent-early-small-2nd", "urgent-early-big", "urgent-late", "urgent-none", "periodic"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestGate_Preempt: an urgent waiter cancels a periodic holder, whose
// context ends with ErrPreempted; an urgent holder is never cancelled.
func TestGate_Preempt(t *testing.T) {
	g := NewGate(1)
	pctx, prel, err := g.Acquire(context.Background(), Claim{Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	admitted := make(chan func())
	go func() {
		uctx, rel, err := g.Acquire(context.Background(), Claim{Urgent: true, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Error(err)
			close(admitted)
			return
		}
		go func() {
			// A second urgent waiter must not cancel the urgent holder.
			_, rel2, err := g.Acquire(context.Background(), Claim{Urgent: true})
			if err == nil {
				rel2()
			}
		}()
		waitGate(t, g, 1)
		if uctx.Err() != nil {
			t.Error("urgent holder cancelled")
		}
		admitted <- rel
	}()
	select {
	case <-pctx.Done():
	case <-time.After(gateWait):
		t.Fatal("periodic holder not preempted")
	}
	if !errors.Is(context.Cause(pctx), ErrPreempted) {
		t.Fatalf("cause %v, want ErrPreempted", context.Cause(pctx))
	}
	prel()
	rel := <-admitted
	if rel == nil {
		t.FailNow()
	}
	rel()
}

// TestGate_CancelWhileWaiting: a waiter whose context ends leaves no trace.
func TestGate_CancelWhileWaiting(t *testing.T) {
	g := NewGate(1)
	_, release, _ := g.Acquire(context.Background(), Claim{Urgent: true})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, _, err := g.Acquire(ctx, Claim{})
		errc <- err
	}()
	waitGate(t, g, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	waitGate(t, g, 0)
	release()
	_, rel, err := g.Acquire(context.Background(), Claim{})
	if err != nil {
		t.Fatal(err)
	}
	rel()
}

// slowStore counts concurrent data uploads and holds each until released.
type slowStore struct {
	cloud.Store
	peak    *atomic.Int32 // shared by the runs' stores
	started *atomic.Int32
	hold    chan struct{}
	live    *liveUploads // shared by the runs' stores
}

// liveUploads counts the uploads whose context is still live: a preempted
// upload gives up its gate slot as soon as its context ends, before its
// Put has returned, and no longer competes for bandwidth.
type liveUploads struct {
	mu   sync.Mutex
	ctxs map[*context.Context]bool
}

func (l *liveUploads) enter(ctx *context.Context) int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctxs == nil {
		l.ctxs = map[*context.Context]bool{}
	}
	l.ctxs[ctx] = true
	n := int32(0)
	for c := range l.ctxs {
		if (*c).Err() == nil {
			n++
		}
	}
	return n
}

func (l *liveUploads) leave(ctx *context.Context) {
	l.mu.Lock()
	delete(l.ctxs, ctx)
	l.mu.Unlock()
}

func (s *slowStore) Put(ctx context.Context, key string, r io.Reader, size int64, o cloud.PutOptions) error {
	if filepath.Base(key) == "w" {
		s.started.Add(1)
		n := s.live.enter(&ctx)
		defer s.live.leave(&ctx)
		for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
		}
		select {
		case <-s.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Put(ctx, key, r, size, o)
}

// TestCommitter_GateAcrossRuns: two runs' committers share one slot; their
// uploads never overlap, and a periodic commit preempted by the other
// run's interruption commit fails with ErrPreempted, leaving its run's
// latest.json as it was.
func TestCommitter_GateAcrossRuns(t *testing.T) {
	g := NewGate(1)
	root := t.TempDir()
	stores := make([]*slowStore, 2)
	cms := make([]*Committer, 2)
	hold := make(chan struct{})
	var peak, started atomic.Int32
	live := &liveUploads{}
	for i := range stores {
		st, err := file.New(filepath.Join(root, fmt.Sprint("store", i)))
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = &slowStore{Store: st, peak: &peak, started: &started, hold: hold, live: live}
		cms[i] = &Committer{Store: stores[i], RunID: fmt.Sprint("run", i), Gate: g}
	}
	mk := func(name string) string { return cptest.WriteDir(t, map[string]string{"w": name}) }
	periodic := make(chan error, 1)
	go func() {
		_, err := cms[0].Commit(context.Background(), Request{Dir: mk("p"), ID: "p1", Step: 1, Reason: "periodic"})
		periodic <- err
	}()
	deadline := time.Now().Add(gateWait)
	for started.Load() == 0 { // the periodic upload holds the slot
		if time.Now().After(deadline) {
			t.Fatal("periodic upload never started")
		}
		time.Sleep(time.Millisecond) // polling a condition, bounded by deadline
	}
	urgent := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := cms[1].Commit(ctx, Request{Dir: mk("u"), ID: "u1", Step: 2, Reason: "interruption", Urgent: true})
		urgent <- err
	}()
	select {
	case err := <-periodic:
		if !errors.Is(err, ErrPreempted) {
			t.Fatalf("periodic commit: %v, want ErrPreempted", err)
		}
	case <-time.After(gateWait):
		close(hold)
		t.Fatal("the periodic commit was not preempted")
	}
	close(hold)
	if err := <-urgent; err != nil {
		t.Fatalf("urgent commit: %v", err)
	}
	if peak.Load() != 1 || started.Load() != 2 {
		t.Fatalf("uploads started %d, at most %d at once; want 2, one at a time", started.Load(), peak.Load())
	}
	if _, err := checkpoint.ReadLatest(context.Background(), stores[0]); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("preempted run's latest.json: %v, want none", err)
	}
	if l, err := checkpoint.ReadLatest(context.Background(), stores[1]); err != nil || l.ID != "u1" {
		t.Fatalf("urgent run's latest.json: %+v %v", l, err)
	}
}

// TestGate_PreemptOncePerUrgentWaiter: an urgent waiter cancels one
// periodic holder (the later in order: the larger), whose slot goes to it
// at once, before the cancelled commit has returned; the other holder runs
// on. The next urgent waiter takes the other slot the same way.
func TestGate_PreemptOncePerUrgentWaiter(t *testing.T) {
	g := NewGate(2)
	p1, rel1, _ := g.Acquire(context.Background(), Claim{Bytes: 1})
	p2, rel2, _ := g.Acquire(context.Background(), Claim{Bytes: 2})
	defer rel1()
	defer rel2()
	acquire := func() func() {
		t.Helper()
		// The commit's context lives on after Acquire: a context that
		// ended would free the slot at once.
		ctx, cancel := context.WithTimeout(context.Background(), gateWait)
		t.Cleanup(cancel)
		_, rel, err := g.Acquire(ctx, Claim{Urgent: true})
		if err != nil {
			t.Fatalf("urgent commit not admitted while the preempted one has not returned: %v", err)
		}
		return rel
	}
	u1 := acquire()
	defer u1()
	if p2.Err() == nil || p1.Err() != nil {
		t.Fatalf("p1 err %v, p2 err %v; want only p2 cancelled", p1.Err(), p2.Err())
	}
	u2 := acquire()
	defer u2()
	if p1.Err() == nil {
		t.Fatal("p1 not cancelled for the second urgent waiter")
	}
}

// TestGate_CancelFreesSlot: a holder whose context ends (the commit hangs,
// say) frees its slot at once, without calling release.
func TestGate_CancelFreesSlot(t *testing.T) {
	g := NewGate(1)
	hctx, cancel := context.WithCancel(context.Background())
	_, rel, err := g.Acquire(hctx, Claim{})
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	ctx, stop := context.WithTimeout(context.Background(), gateWait)
	defer stop()
	admitted := make(chan error, 1)
	go func() {
		_, rel2, err := g.Acquire(ctx, Claim{})
		if err == nil {
			rel2()
		}
		admitted <- err
	}()
	waitGate(t, g, 1)
	cancel() // never released: the holder is stuck
	if err := <-admitted; err != nil {
		t.Fatalf("waiter not admitted after the holder's context ended: %v", err)
	}
	rel() // a late release frees nothing twice
	if g.Waiting() != 0 || len(g.held) != 0 {
		t.Fatalf("waiting %d, held %d after everything returned", g.Waiting(), len(g.held))
	}
}
