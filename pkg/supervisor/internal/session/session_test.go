package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata"
)

type metrics struct {
	mu      sync.Mutex
	goodput int
	errs    []string
}

func (m *metrics) Goodput(*journal.Goodput) { m.mu.Lock(); m.goodput++; m.mu.Unlock() }
func (m *metrics) Error(c string)           { m.mu.Lock(); m.errs = append(m.errs, c); m.mu.Unlock() }

func TestSession_RecordsItselfInTheJournal(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := &metrics{}
	before := time.Now()
	s := New("a1b2c3d4e5f6", ctx, zap.NewNop(), m)
	if s.ID() != "a1b2c3d4e5f6" || s.Started().Before(before) || s.Started().After(time.Now()) {
		t.Fatalf("id %q started %v, want the id given, started now", s.ID(), s.Started())
	}
	s.JournalRead(st, &journal.Journal{Format: journal.Format, RunID: "r", Stats: journal.Stats{RunSeconds: 100}})
	if got := s.RunSeconds(); got < 100 || got > 100+time.Since(before).Seconds() {
		t.Fatalf("run seconds %v, want the 100 before this session and its own", got)
	}
	s.RecordSession(metadata.Identity{Cloud: "aws", InstanceID: "i-1", Zone: "z"})
	s.AwaitLanding(time.Now().Add(testutil.Wait))
	j, err := journal.Read(ctx, st, "r")
	if err != nil {
		t.Fatal(err)
	}
	rec := j.SessionByID(s.ID())
	if rec == nil {
		t.Fatalf("journal sessions %+v: this one is missing", j.Sessions)
	}
	if rec.Instance.InstanceID != "i-1" || rec.Instance.Cloud != "aws" || !rec.Start.Equal(s.Started().UTC()) {
		t.Fatalf("recorded %+v, want instance i-1 on aws started %v", rec, s.Started().UTC())
	}
	if m.goodput != 1 || len(m.errs) != 0 {
		t.Fatalf("metrics: goodput %d errors %v, want one goodput, no error", m.goodput, m.errs)
	}
}

func TestSession_JournalWriteOutlivesTheAgentsLife(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &metrics{}
	s := New("a1b2c3d4e5f6", ctx, zap.NewNop(), m)
	s.JournalRead(st, &journal.Journal{Format: journal.Format, RunID: "r"})
	cancel() // the agent's life ended: the write still lands (it outlives it)
	s.JournalAsync(func(j *journal.Journal) { j.Stats.Failures++ })
	s.AwaitLanding(time.Now().Add(testutil.Wait))
	j, err := journal.Read(context.Background(), st, "r")
	if err != nil {
		t.Fatal(err)
	}
	if j.Stats.Failures != 1 || len(m.errs) != 0 {
		t.Fatalf("failures %d, errors %v: the write after the agent's life did not land", j.Stats.Failures, m.errs)
	}
}

func TestSession_AckAbandonedAtTheExit(t *testing.T) {
	s := New("a1b2c3d4e5f6", context.Background(), zap.NewNop(), &metrics{})
	acked := make(chan struct{})
	s.GoAck(func(landing context.Context) { close(acked) })
	abandoned := make(chan error, 1)
	s.GoAck(func(landing context.Context) {
		<-landing.Done() // an acknowledgement that never answers
		abandoned <- landing.Err()
	})
	s.AwaitLanding(time.Now().Add(50 * time.Millisecond))
	select {
	case <-acked:
	default:
		t.Fatal("the acknowledgement that answered did not run")
	}
	select {
	case err := <-abandoned:
		if err == nil {
			t.Fatal("abandoned acknowledgement: its context not cancelled")
		}
	case <-time.After(testutil.Wait):
		t.Fatal("the acknowledgement in flight was not abandoned at the exit")
	}
}

func TestSession_ExitWriteGetsASecond(t *testing.T) {
	s := New("a1b2c3d4e5f6", context.Background(), zap.NewNop(), &metrics{})
	ctx, cancel := s.ExitWrite(time.Now().Add(-time.Hour)) // the deadline passed long ago
	defer cancel()
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) < 500*time.Millisecond {
		t.Fatalf("exit write deadline %v (in %v), want about a second", dl, time.Until(dl))
	}
	by := time.Now().Add(time.Hour)
	ctx2, cancel2 := s.ExitWrite(by)
	defer cancel2()
	if dl, _ := ctx2.Deadline(); !dl.Equal(by) {
		t.Fatalf("exit write deadline %v, want %v", dl, by)
	}
}

func TestMachineOf(t *testing.T) {
	m := MachineOf(metadata.Identity{Cloud: "gcp", InstanceID: "42", InstanceType: "a2", Zone: "z", Lifecycle: "spot", Name: "vm"})
	if m.Cloud != "gcp" || m.InstanceID != "42" || m.InstanceType != "a2" || m.Zone != "z" || m.Lifecycle != "spot" || m.Name != "vm" {
		t.Fatalf("machine %+v: a field of the identity lost", m)
	}
}

// downStore is a store whose Stat fails (a connection reset) while down:
// every journal write's first request.
type downStore struct {
	cloud.Store
	down  atomic.Bool
	stats atomic.Int32 // Stat calls while down
}

func (d *downStore) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	if d.down.Load() {
		d.stats.Add(1)
		return cloud.ObjectInfo{}, errors.New("stat journal.json: connection reset by peer")
	}
	return d.Store.Stat(ctx, key)
}

// A journal write that failed while the store was down is made again until
// the store is back, not dropped: an outage longer than one write's
// requests' attempts lost the failed interruption checkpoint's record,
// although the store was back before the exit stopped waiting
// (cmd/spotagent TestStoreFault_DownDuringInterruption, 1 run in 8 under
// load). A write the store refuses for good is not made again.
func TestSession_JournalWriteRetriedUntilTheStoreIsBack(t *testing.T) {
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &downStore{Store: fs}
	st.down.Store(true)
	m := &metrics{}
	s := New("a1b2c3d4e5f6", context.Background(), zap.NewNop(), m)
	s.JournalRead(st, &journal.Journal{Format: journal.Format, RunID: "r"})
	s.JournalAsync(func(j *journal.Journal) { j.Stats.Failures++ })
	testutil.WaitFor(t, "the write made again while the store is down", func() bool { return st.stats.Load() >= 3 })
	st.down.Store(false)
	s.AwaitLanding(time.Now().Add(testutil.Wait))
	j, err := journal.Read(context.Background(), fs, "r")
	if err != nil {
		t.Fatal(err)
	}
	if j.Stats.Failures != 1 || len(m.errs) != 0 {
		t.Fatalf("failures %d, errors %v: the write did not land once the store was back", j.Stats.Failures, m.errs)
	}

	p := journalRetry(fs)
	if p.Retryable(fmt.Errorf("write journal: %w", checkpoint.ErrFenced)) ||
		p.Retryable(fmt.Errorf("put journal.json: %w", cloud.ErrAccessDenied)) {
		t.Fatal("a fenced session's write, or one refused for good, is made again")
	}
}

// judgedStore is a store whose backend judges a 501 not worth another
// attempt (the Retryable of the store's retry layer, pkg/cloud/wrap), and
// whose every Put fails with one.
type judgedStore struct {
	cloud.Store
	puts atomic.Int32
}

func (j *judgedStore) Retryable(err error) bool { return !strings.Contains(err.Error(), "status 501") }

func (j *judgedStore) Put(context.Context, string, io.Reader, int64, cloud.PutOptions) error {
	j.puts.Add(1)
	return errors.New("put journal.json: status 501")
}

// A journal write that the store's own classification gives up on (a
// store that cannot do conditional writes answers 501) fails at once: it
// was made again every 2 s for a minute, and held the exit its whole wait.
// One that it would try again is made again.
func TestSession_JournalWriteTheStoreGivesUpOnIsNotMadeAgain(t *testing.T) {
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &judgedStore{Store: fs}
	if p := journalRetry(st); !p.Retryable(errors.New("put journal.json: connection reset by peer")) {
		t.Fatal("a reset is not made again")
	}
	m := &metrics{}
	s := New("a1b2c3d4e5f6", context.Background(), zap.NewNop(), m)
	s.JournalRead(st, &journal.Journal{Format: journal.Format, RunID: "r"})
	s.JournalAsync(func(j *journal.Journal) { j.Stats.Failures++ })
	s.AwaitLanding(time.Now().Add(testutil.Wait))
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := st.puts.Load(); n != 1 || len(m.errs) != 1 {
		t.Fatalf("%d puts, errors %v: want one put, and the write's failure reported", n, m.errs)
	}
}
