package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Many agents end sessions at once, each refreshing its run's entry with a
// compare-and-swap on the one summary object: none is lost.
func TestRecordSession_Race(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		const agents, sessions = 24, 3
		var wg sync.WaitGroup
		errs := make(chan error, agents*sessions)
		for a := range agents {
			wg.Go(func() {
				id := fmt.Sprintf("run-%02d", a)
				j := &checkpoint.Journal{Format: checkpoint.JournalFormat, RunID: id}
				for s := range sessions {
					start := at(time.Duration(s) * time.Hour)
					j.Sessions = append(j.Sessions, checkpoint.Session{ID: fmt.Sprint(s), Start: start, End: tp(time.Duration(s)*time.Hour + 50*time.Minute),
						Instance: p4dA, BlockedSeconds: fp(0)})
					if err := RecordSession(context.Background(), root, id, j, int64(100*(s+1))); err != nil {
						errs <- fmt.Errorf("%s session %d: %w", id, s, err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		s, err := ReadSummary(t.Context(), root)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(s.Runs); got != agents {
			t.Fatalf("summary has %d runs, want %d", got, agents)
		}
		for dir, r := range s.Runs {
			if r.Sessions != sessions || r.Steps != 100*sessions || !near(r.Total().Machine, sessions*50*60) {
				t.Errorf("%s: %d sessions, step %d, %v s on machines; want %d, %d, %d (a lost update)",
					dir, r.Sessions, r.Steps, r.Total().Machine, sessions, 100*sessions, sessions*50*60)
			}
		}
	})
}

// Two agents of one job share a journal: the one that writes last with an
// older snapshot does not undo the newer entry.
func TestRecordSession_KeepsFullerJournal(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, _ func(string) cloud.Store) {
		j := &checkpoint.Journal{RunID: "job", Sessions: []checkpoint.Session{
			{ID: "a", Start: at(0), End: tp(time.Hour), Instance: p4dA},
			{ID: "b", Start: at(0), End: tp(time.Hour), Instance: p4dB},
		}}
		if err := RecordSession(t.Context(), root, "job", j, 0); err != nil {
			t.Fatal(err)
		}
		old := &checkpoint.Journal{RunID: "job", Sessions: j.Sessions[:1]}
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

// fleet reads the summary; its figures are the recount's. Without a
// complete summary (none, or one only agents wrote) it recounts and saves
// one. A summary that no longer parses is an error unless --recount, and is
// replaced by the next update.
func TestLoad(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, open func(string) cloud.Store) {
		writeFleet(t, open)
		now := at(100 * time.Hour)
		ctx := t.Context()
		// An agent ends a session before anyone ran fleet: the summary it
		// creates knows only its run.
		j, err := checkpoint.ReadJournal(ctx, open("eval-c"), "eval-c")
		if err != nil {
			t.Fatal(err)
		}
		if err := RecordSession(ctx, root, "eval-c", j, 1000); err != nil {
			t.Fatal(err)
		}
		l, err := Load(ctx, root, false, false, now)
		if err != nil || l.Source != "recount" || len(l.Damaged) != 2 || l.SaveErr != nil || len(l.Summary.Runs) != 4 {
			t.Fatalf("partial summary: %+v, err %v; want a recount of 4 runs with 2 damaged, saved", l, err)
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

		junk := []byte("{not a summary")
		if err := root.Put(ctx, summaryKey, bytes.NewReader(junk), int64(len(junk)), cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(ctx, root, false, false, now); err == nil {
			t.Fatal("a damaged summary was read")
		}
		if l, err := Load(ctx, root, true, false, now); err != nil || l.Source != "recount" {
			t.Fatalf("--recount over a damaged summary: %+v, %v", l, err)
		}
		nj := &checkpoint.Journal{RunID: "new", Sessions: []checkpoint.Session{{Start: at(0), End: tp(time.Hour), Instance: a2}}}
		if err := RecordSession(ctx, root, "new", nj, 0); err != nil {
			t.Fatal(err)
		}
		s3, err := ReadSummary(ctx, root)
		if err != nil || len(s3.Runs) != 1 || !s3.Baseline.IsZero() {
			t.Fatalf("after a session over a damaged summary: %+v, err %v; want 1 run, no baseline", s3, err)
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
