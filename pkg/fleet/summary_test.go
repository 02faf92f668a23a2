package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// flaky fails some of the requests to a store: a share of puts before they
// land, a share after (landed, but the caller hears an error), and a share
// of gets and lists. It counts puts per key and every request.
type flaky struct {
	cloud.Store
	failPut, failAfterPut, failRead float64
	mu                              sync.Mutex
	rng                             *rand.Rand
	puts                            map[string]int
	requests, bytes                 atomic.Int64
}

var errInjected = errors.New("injected failure")

func newFlaky(st cloud.Store, failPut, failAfterPut, failRead float64) *flaky {
	return &flaky{Store: st, failPut: failPut, failAfterPut: failAfterPut, failRead: failRead,
		rng: rand.New(rand.NewPCG(1, 2)), puts: map[string]int{}}
}

func (f *flaky) roll(p float64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

func (f *flaky) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	f.requests.Add(1)
	f.bytes.Add(size)
	if f.roll(f.failPut) {
		return errInjected
	}
	f.mu.Lock()
	f.puts[key]++
	f.mu.Unlock()
	if err := f.Store.Put(ctx, key, r, size, opts); err != nil {
		return err
	}
	if f.roll(f.failAfterPut) {
		return errInjected
	}
	return nil
}

func (f *flaky) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	f.requests.Add(1)
	if f.roll(f.failRead) {
		return nil, errInjected
	}
	return f.Store.Get(ctx, key, offset, length)
}

func (f *flaky) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	f.requests.Add(1)
	return f.Store.Stat(ctx, key)
}

func (f *flaky) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	f.requests.Add(1)
	if f.roll(f.failRead) {
		return errInjected
	}
	return f.Store.List(ctx, prefix, fn)
}

func (f *flaky) Delete(ctx context.Context, key string) error {
	f.requests.Add(1)
	return f.Store.Delete(ctx, key)
}

// session appends session s (50 min on m) to j.
func session(j *journal.Journal, s int, m checkpoint.Machine) {
	start := at(time.Duration(s) * time.Hour)
	j.Sessions = append(j.Sessions, journal.Session{ID: fmt.Sprint(s), Start: start, End: tp(time.Duration(s)*time.Hour + 50*time.Minute),
		Instance: m, BlockedSeconds: fp(0)})
}

// readUntil reads the fleet, retrying the reads an injected failure broke.
func readUntil(t *testing.T, st cloud.Store) *Summary {
	t.Helper()
	for range 50 {
		s, err := ReadSummary(t.Context(), st)
		if err == nil {
			return s
		}
		if !errors.Is(err, errInjected) {
			t.Fatal(err)
		}
	}
	t.Fatal("every read failed")
	return nil
}

// Many agents end sessions at once while a quarter of their writes fail
// (some after landing): each session is its own new object, no key is
// written by two agents, and every session of every run is in the fleet.
func TestRecordSession_Race(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		const agents, sessions = 48, 3
		st := newFlaky(root, 0.15, 0.1, 0)
		var wg sync.WaitGroup
		owner := map[string]string{} // key → the agent that wrote it
		var failed atomic.Int64
		for a := range agents {
			wg.Go(func() {
				id := fmt.Sprintf("run-%02d", a)
				j := &journal.Journal{Format: journal.Format, RunID: id}
				for s := range sessions {
					session(j, s, p4dA)
					// What the agent's call site does: one call per session end.
					for RecordSession(context.Background(), st, id, j, int64(100*(s+1))) != nil {
						failed.Add(1) // five failed attempts in a row: the next session end records it
					}
				}
			})
		}
		wg.Wait()
		st.mu.Lock()
		for key := range st.puts {
			rk, ok := parseRecordName(key)
			if !ok {
				t.Errorf("agents wrote %s, not a session record", key)
				continue
			}
			if o, ok := owner[key]; ok && o != rk.Dir {
				t.Errorf("%s written by %s and %s", key, o, rk.Dir)
			}
			owner[key] = rk.Dir
		}
		st.mu.Unlock()
		s := readUntil(t, root)
		if got := len(s.Runs); got != agents {
			t.Fatalf("fleet has %d runs, want %d", got, agents)
		}
		for dir, r := range s.Runs {
			if r.Sessions != sessions || r.Steps != 100*sessions || !near(r.Total().Machine, sessions*50*60) {
				t.Errorf("%s: %d sessions, step %d, %v s on machines; want %d, %d, %d (a lost session)",
					dir, r.Sessions, r.Steps, r.Total().Machine, sessions, 100*sessions, sessions*50*60)
			}
		}
		t.Logf("%d calls gave up after 5 failed writes and were called again", failed.Load())
	})
}

// Compactions run while agents record: no record written during one is
// lost, and once every agent is done and a last compaction ran, the
// records are gone and the summary holds every session.
func TestCompact_DuringRecords(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		const agents, sessions = 16, 4
		now := at(100 * time.Hour)
		// A complete summary (a recount of an empty fleet) to compact into.
		if _, err := Load(t.Context(), root, true, true, now); err != nil {
			t.Fatal(err)
		}
		st := newFlaky(root, 0.05, 0.05, 0.05)
		stop := make(chan struct{})
		var compactions atomic.Int64
		first := make(chan struct{})
		var once sync.Once
		var cw sync.WaitGroup
		for range 2 { // two `spotagent fleet` at once, over and over
			cw.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if l, err := Load(context.Background(), st, false, false, now); err == nil && l.Compact(context.Background()) == nil {
						compactions.Add(1)
						once.Do(func() { close(first) })
					}
				}
			})
		}
		var wg sync.WaitGroup
		for a := range agents {
			wg.Go(func() {
				id := fmt.Sprintf("run-%02d", a)
				j := &journal.Journal{Format: journal.Format, RunID: id}
				for s := range sessions {
					if s == sessions/2 { // half recorded: let a compaction through
						select {
						case <-first:
						case <-time.After(time.Minute):
							t.Error("no compaction in a minute")
						}
					}
					session(j, s, []checkpoint.Machine{p4dA, p4dB, a2}[s%3])
					for RecordSession(context.Background(), st, id, j, int64(s+1)) != nil {
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		cw.Wait()
		if compactions.Load() == 0 {
			t.Fatal("no compaction ran while the agents recorded")
		}
		l, err := Load(t.Context(), root, false, false, now)
		if err == nil {
			err = l.Compact(t.Context())
		}
		if err != nil || l.Source != "summary" {
			t.Fatalf("last compaction: %+v, %v", l, err)
		}
		var left []string
		root.List(t.Context(), recordsPrefix, func(o cloud.ObjectInfo) error { left = append(left, o.Key); return nil })
		if len(left) != 0 {
			t.Errorf("records left after the last compaction: %v", left)
		}
		s := readUntil(t, root)
		if len(s.Runs) != agents {
			t.Fatalf("%d runs, want %d", len(s.Runs), agents)
		}
		for dir, r := range s.Runs {
			if r.Sessions != sessions || r.Steps != sessions {
				t.Errorf("%s: %d sessions, step %d; want %d, %d (a record lost in a compaction)", dir, r.Sessions, r.Steps, sessions, sessions)
			}
		}
		t.Logf("%d compactions ran during the records", compactions.Load())
	})
}

// Two agents of one job share a journal: the one that writes last with an
// older snapshot does not undo the newer entry.
func TestRecordSession_KeepsFullerJournal(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		j := &journal.Journal{RunID: "job", Sessions: []journal.Session{
			{ID: "a", Start: at(0), End: tp(time.Hour), Instance: p4dA},
			{ID: "b", Start: at(0), End: tp(time.Hour), Instance: p4dB},
		}}
		if err := RecordSession(t.Context(), root, "job", j, 0); err != nil {
			t.Fatal(err)
		}
		old := &journal.Journal{RunID: "job", Sessions: j.Sessions[:1]}
		if err := RecordSession(t.Context(), root, "job", old, 0); err != nil {
			t.Fatal(err)
		}
		s, err := ReadSummary(t.Context(), root)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Runs["job"].Sessions; got != 2 {
			t.Errorf("sessions=%d, want 2", got)
		}
	})
}

// fleet reads the summary and the records since; its figures are the
// recount's. Without a complete summary (none, or one without a baseline)
// it recounts and saves one. A summary that no longer parses is an error
// unless --recount, which replaces it with --save-summary.
func TestLoad(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, open func(string) cloud.Store) {
		writeFleet(t, open)
		now := at(100 * time.Hour)
		ctx := t.Context()
		// An agent ends a session before anyone ran fleet.
		j, err := journal.Read(ctx, open("eval-c"), "eval-c")
		if err != nil {
			t.Fatal(err)
		}
		if err := RecordSession(ctx, root, "eval-c", j, 1000); err != nil {
			t.Fatal(err)
		}
		l, err := Load(ctx, root, false, false, now)
		if err == nil {
			err = l.Compact(ctx)
		}
		if err != nil || l.Source != "recount" || len(l.Damaged) != 2 || len(l.Summary.Runs) != 4 {
			t.Fatalf("no summary: %+v, err %v; want a recount of 4 runs with 2 damaged, saved", l, err)
		}
		want, _ := Build(l.Summary, Options{Now: now}, "", nil)
		l2, err := Load(ctx, root, false, false, now)
		if err != nil || l2.Source != "summary" {
			t.Fatalf("source %+v, err %v; want the summary the recount saved", l2, err)
		}
		got, _ := Build(l2.Summary, Options{Now: now}, "", nil)
		if got.Total.Interruptions != want.Total.Interruptions || !near(got.Total.MachineHours, want.Total.MachineHours) ||
			!near(got.Total.Goodput, want.Total.Goodput) || len(got.Runs) != len(want.Runs) || len(got.Runs) != 4 {
			t.Errorf("from the summary %+v, recount %+v", got.Total, want.Total)
		}
		// A new run's session: in the next fleet from its record, then
		// compacted into the summary.
		nj := &journal.Journal{RunID: "new", Sessions: []journal.Session{{Start: at(0), End: tp(time.Hour), Instance: a2}}}
		if err := RecordSession(ctx, root, "new", nj, 0); err != nil {
			t.Fatal(err)
		}
		if l, err := Load(ctx, root, false, false, now); err != nil || l.Source != "summary" || len(l.Summary.Runs) != 5 || l.Compact(ctx) != nil {
			t.Fatalf("after a new record: %+v, %v; want 5 runs from the summary", l, err)
		}
		snap, _, err := readSummaryAt(ctx, root, snapshotKey)
		if err != nil || len(snap.Runs) != 5 || snap.Generation != 2 {
			t.Fatalf("compacted summary: %+v, %v; want 5 runs, generation 2", snap, err)
		}

		junk := []byte("{not a summary")
		if err := root.Put(ctx, snapshotKey, bytes.NewReader(junk), int64(len(junk)), cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(ctx, root, false, false, now); err == nil || !strings.Contains(err.Error(), "--recount") {
			t.Fatalf("a damaged summary was read: %v", err)
		}
		if l, err := Load(ctx, root, true, true, now); err != nil || l.Source != "recount" || len(l.Summary.Runs) != 4 {
			t.Fatalf("--recount --save-summary over a damaged summary: %+v, %v", l, err)
		}
		if l, err := Load(ctx, root, false, false, now); err != nil || l.Source != "summary" {
			t.Fatalf("after the recount replaced it: %+v, %v", l, err)
		}
	})
}

// A v1 summary, rewritten at the root by agents before session records,
// is merged once into the summary; an older agent that still rewrites it
// gets its update merged again; its runs feed the prior.
func TestLoad_LegacySummary(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, open func(string) cloud.Store) {
		ctx := t.Context()
		now := at(100 * time.Hour)
		putV1 := func(runs ...string) {
			s := Summary{Format: summaryFormatV1, Updated: now, Baseline: now, Runs: map[string]*Run{}}
			for i, id := range runs {
				j := &journal.Journal{RunID: id}
				session(j, i, p4dA)
				j.Sessions[0].End = tp(time.Duration(i)*time.Hour + 60*time.Hour) // 60 h on p4dA
				r, err := runFromJournal(j, id, 0, now)
				if err != nil {
					t.Fatal(err)
				}
				s.Runs[id] = r
			}
			b, _ := json.Marshal(s)
			if err := root.Put(ctx, legacyKey, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		putV1("old-a", "old-b")
		l, err := Load(ctx, root, false, false, now)
		if err == nil {
			err = l.Compact(ctx)
		}
		if err != nil || len(l.Summary.Runs) != 2 {
			t.Fatalf("first fleet over a v1 summary: %+v, %v; want its 2 runs", l, err)
		}
		snap, _, err := readSummaryAt(ctx, root, snapshotKey)
		if err != nil || len(snap.Runs) != 2 || snap.Legacy == "" {
			t.Fatalf("migrated summary: %+v, %v", snap, err)
		}
		p, err := PriorFrom(ctx, root, Key{"aws", "p4d.24xlarge", "us-east-1a"}, 0.05, DefaultMinHours)
		if err != nil || p.Source != "zone" || !near(p.Hours, 120) {
			t.Errorf("prior after the migration: %+v, %v; want the 2 old runs' hours", p, err)
		}
		putV1("old-a", "old-b", "old-c") // an agent not yet upgraded
		l, err = Load(ctx, root, false, false, now)
		if err == nil {
			err = l.Compact(ctx)
		}
		if err != nil || len(l.Summary.Runs) != 3 {
			t.Fatalf("after an old agent's update: %+v, %v; want 3 runs", l, err)
		}
		if snap, _, _ = readSummaryAt(ctx, root, snapshotKey); len(snap.Runs) != 3 {
			t.Errorf("old agent's update not compacted: %d runs", len(snap.Runs))
		}
	})
}

func TestReadSummary_Missing(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		if _, err := ReadSummary(t.Context(), root); !errors.Is(err, cloud.ErrNotExist) {
			t.Fatalf("err=%v, want ErrNotExist", err)
		}
	})
}

// An agent's prior reads its instance type's sums and the names of the
// records since, in a bounded number of requests however many runs the
// fleet has; it equals the prior over the whole fleet.
func TestPriorFrom(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		ctx := t.Context()
		now := at(1000 * time.Hour)
		record := func(n int, m checkpoint.Machine, hours float64, notices int) {
			for i := range n {
				id := fmt.Sprintf("%s-%s-%d", m.InstanceType, m.Zone, i)
				if hours == 0 {
					id += "-late"
				}
				j := &journal.Journal{RunID: id, Sessions: []journal.Session{{ID: "s", Start: at(0),
					End: tp(time.Duration(max(hours, 1) * float64(time.Hour))), Instance: m}}}
				for k := range notices {
					j.Interruptions = append(j.Interruptions, journal.Interruption{Cloud: m.Cloud, InstanceType: m.InstanceType, Zone: m.Zone,
						Detected: at(time.Duration(k+1) * time.Minute), CommitOK: k == 0})
				}
				if err := RecordSession(ctx, root, id, j, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		record(30, p4dA, 5, 1)
		record(20, p4dB, 3, 0)
		record(10, a2, 10, 2)
		if _, err := Load(ctx, root, true, true, now); err != nil { // compacts
			t.Fatal(err)
		}
		record(5, p4dA, 0, 1) // since the compaction: 1 h each
		st := newFlaky(root, 0, 0, 0)
		for _, k := range []Key{{"aws", "p4d.24xlarge", "us-east-1a"}, {"aws", "p4d.24xlarge", "us-east-1b"}, {"gcp", "a2-highgpu-1g", "us-central1-a"}, {"aws", "p5", "z"}} {
			st.requests.Store(0)
			got, err := PriorFrom(ctx, st, k, 0.05, DefaultMinHours)
			if err != nil {
				t.Fatal(err)
			}
			if n := st.requests.Load(); n > 5 {
				t.Errorf("%v: %d requests, want at most 5", k, n)
			}
			s, err := ReadSummary(ctx, root)
			if err != nil {
				t.Fatal(err)
			}
			want := PriorFor(s, k, 0.05, DefaultMinHours)
			if got.Source != want.Source || !near(got.Hours, want.Hours) || got.Interruptions != want.Interruptions ||
				got.NoticeCommits != want.NoticeCommits || !near(got.Rate, want.Rate) {
				t.Errorf("%v: prior %+v, over the whole fleet %+v", k, got, want)
			}
		}
	})
}

func TestRecordName(t *testing.T) {
	k := Key{"aws", "p4d/odd", ""}
	name := recordName(k, "team/.hidden run", Tally{Machine: 3600.7, Interruptions: 2, NoticeCommits: 1}, 7)
	if err := cloud.ValidKey(name); err != nil || strings.Contains(name, "/.") {
		t.Fatalf("%s: %v", name, err)
	}
	rk, ok := parseRecordName(name)
	if !ok || rk.Key != k || rk.Dir != "team/.hidden run" || rk.Tally != (Tally{3600, 2, 1}) || rk.Entries != 7 {
		t.Errorf("%s parsed as %+v, %v", name, rk, ok)
	}
	for _, bad := range []string{"fleet/sessions/a/b/c/d.json", "fleet/sessions/a/b/c/d/1.2.3.json", "fleet/sessions/a/b/c/d/1.x.3.4.ab.json", "fleet/summary.json"} {
		if _, ok := parseRecordName(bad); ok {
			t.Errorf("%s parsed", bad)
		}
	}
}

func TestPriorFor(t *testing.T) {
	s := &Summary{Runs: map[string]*Run{
		"a": {Cells: []Cell{{Key: Key{"aws", "p5", "z1"}, Machine: 100 * 3600, Interruptions: 10}}},
		"b": {Cells: []Cell{{Key: Key{"aws", "p5", "z2"}, Machine: 20 * 3600, Interruptions: 1},
			{Key: Key{"aws", "p4d", "z1"}, Machine: 10 * 3600, Interruptions: 3}}},
	}}
	for _, c := range []struct {
		k      Key
		source string
		rate   float64
	}{
		{Key{"aws", "p5", "z1"}, "zone", (0.05*24 + 10) / 124},
		{Key{"aws", "p5", "z2"}, "instance type", (0.05*24 + 11) / 144}, // 20 h in z2 < 48
		{Key{"aws", "p4d", "z1"}, "flag", 0.05},
		{Key{"gcp", "p5", "z1"}, "flag", 0.05},
	} {
		p := PriorFor(s, c.k, 0.05, DefaultMinHours)
		if p.Source != c.source || !near(p.Rate, c.rate) {
			t.Errorf("%v: %s %v, want %s %v", c.k, p.Source, p.Rate, c.source, c.rate)
		}
	}
	if p := PriorFor(nil, Key{"aws", "p5", "z1"}, 0.05, DefaultMinHours); p.Source != "flag" || p.Rate != 0.05 {
		t.Errorf("no summary: %+v", p)
	}
}

// The agents of a job share a journal and end together: each files its
// record under its own session's machine.
func TestRecordSessionOf_OwnSession(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		j := &journal.Journal{RunID: "job", Sessions: []journal.Session{
			{ID: "a", Start: at(0), End: tp(time.Hour), Instance: p4dA},
			{ID: "b", Start: at(0), End: tp(time.Hour), Instance: p4dB},
		}}
		for _, id := range []string{"a", "b"} {
			if err := RecordSessionOf(t.Context(), root, "job", j, 0, id); err != nil {
				t.Fatal(err)
			}
		}
		zones := map[string]int{}
		root.List(t.Context(), recordsPrefix, func(o cloud.ObjectInfo) error {
			rk, ok := parseRecordName(o.Key)
			if !ok || rk.Tally.Machine != 3600 {
				t.Errorf("record %s: %+v", o.Key, rk)
			}
			zones[rk.Zone]++
			return nil
		})
		if zones[p4dA.Zone] != 1 || zones[p4dB.Zone] != 1 {
			t.Errorf("records by zone %v, want one in each session's zone", zones)
		}
	})
}
