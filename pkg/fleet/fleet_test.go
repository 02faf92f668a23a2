package fleet

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// stores runs fn against a file store and the in-process S3: open(dir)
// opens the store of the run in dir under the fleet root, as an agent
// with --store ROOT/dir would; root is the fleet's store.
func stores(t *testing.T, fn func(t *testing.T, root cloud.Store, open func(dir string) cloud.Store)) {
	t.Run("file", func(t *testing.T) {
		base := t.TempDir()
		open := func(dir string) cloud.Store {
			st, err := file.New(filepath.Join(base, dir))
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		fn(t, open(""), open)
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.New(t)
		prefix := cloudtest.Prefix()
		open := func(dir string) cloud.Store {
			st, err := s3.New(t.Context(), srv.Bucket, strings.TrimSuffix(prefix+"/"+dir, "/"), s3.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}
		fn(t, open(""), open)
	})
}

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time  { return t0.Add(d) }
func tp(d time.Duration) *time.Time { v := at(d); return &v }
func fp(v float64) *float64         { return &v }

var (
	p4dA = checkpoint.Machine{Cloud: "aws", InstanceType: "p4d.24xlarge", Zone: "us-east-1a", InstanceID: "i-1"}
	p4dB = checkpoint.Machine{Cloud: "aws", InstanceType: "p4d.24xlarge", Zone: "us-east-1b", InstanceID: "i-2"}
	a2   = checkpoint.Machine{Cloud: "gcp", InstanceType: "a2-highgpu-1g", Zone: "us-central1-a", InstanceID: "g-1"}
)

// writeJournal writes a run's journal with the agent's own writer.
func writeJournal(t *testing.T, st cloud.Store, runID string, fn func(j *journal.Journal)) {
	t.Helper()
	w := journal.NewWriter(st, &journal.Journal{Format: journal.Format, RunID: runID})
	if err := w.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func writeLatest(t *testing.T, st cloud.Store, step int64) {
	t.Helper()
	l := checkpoint.Latest{Manifest: checkpoint.Prefix(step, "c") + "manifest.json", Step: step, ID: "c"}
	if err := checkpoint.UpdateLatest(context.Background(), st, l); err != nil {
		t.Fatal(err)
	}
}

// writeFleet writes three runs, a journal that is not JSON and one cut in
// its second session, under root.
func writeFleet(t *testing.T, open func(dir string) cloud.Store) {
	// train-a: 10 h on p4d in us-east-1a, a notice with a 2 min lead whose
	// checkpoint committed after 60 s, 30 min without a machine, 9.5 h in
	// us-east-1b after a 120 s restore.
	st := open("train-a")
	writeJournal(t, st, "train-a", func(j *journal.Journal) {
		j.Sessions = append(j.Sessions,
			journal.Session{ID: "s1", Start: at(0), End: tp(10*time.Hour + time.Minute), Instance: p4dA, BlockedSeconds: fp(360)},
			journal.Session{ID: "s2", Start: at(10*time.Hour + 30*time.Minute), End: tp(20 * time.Hour), Instance: p4dB, BlockedSeconds: fp(300)})
		j.Interruptions = append(j.Interruptions, journal.Interruption{Cloud: "aws", Kind: "spot", InstanceType: p4dA.InstanceType, Zone: p4dA.Zone,
			Notice: at(10 * time.Hour), Detected: at(10 * time.Hour), Deadline: tp(10*time.Hour + 2*time.Minute),
			Committed: tp(10*time.Hour + time.Minute), CommitOK: true, Step: 9000})
		j.Restores = append(j.Restores, journal.RestoreEntry{At: at(10*time.Hour + 30*time.Minute), Step: 9000, Seconds: 120})
	})
	writeLatest(t, st, 18000)
	// train-b: 5 h on GCP a2, lost without notice (30 min, 900 steps), back
	// after 1 h, 2 h more.
	st = open("train-b")
	writeJournal(t, st, "train-b", func(j *journal.Journal) {
		j.Sessions = append(j.Sessions,
			journal.Session{ID: "s1", Start: at(0), End: tp(5 * time.Hour), Instance: a2, BlockedSeconds: fp(0)},
			journal.Session{ID: "s2", Start: at(6 * time.Hour), End: tp(8 * time.Hour), Instance: a2, BlockedSeconds: fp(0)})
		j.Interruptions = append(j.Interruptions, journal.Interruption{Cloud: "gcp", Kind: "preempted",
			Notice: at(5 * time.Hour), Detected: at(5 * time.Hour), Loss: journal.Loss{LostSeconds: 1800, LostSteps: 900}})
	})
	writeLatest(t, st, 20000)
	// eval-c: 2 h in us-east-1a, started 3 days later, no interruption.
	st = open("eval-c")
	writeJournal(t, st, "eval-c", func(j *journal.Journal) {
		j.Sessions = append(j.Sessions, journal.Session{ID: "s1", Start: at(72 * time.Hour), End: tp(74 * time.Hour), Instance: p4dA, BlockedSeconds: fp(0)})
	})
	writeLatest(t, st, 1000)
	ctx := context.Background()
	put := func(st cloud.Store, b []byte) {
		if err := st.Put(ctx, checkpoint.JournalKey, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(open("broken"), []byte("\x00\x01 not json"))
	// partial: the first session (1 h in us-east-1a) survives the cut.
	st = open("partial")
	writeJournal(t, st, "partial", func(j *journal.Journal) {
		j.Sessions = append(j.Sessions,
			journal.Session{ID: "s1", Start: at(time.Hour), End: tp(2 * time.Hour), Instance: p4dA, BlockedSeconds: fp(0)},
			journal.Session{ID: "s2", Start: at(3 * time.Hour), End: tp(4 * time.Hour), Instance: p4dA, BlockedSeconds: fp(0)})
	})
	b, err := checkpoint.ReadSmall(ctx, st, checkpoint.JournalKey, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	put(st, b[:bytes.Index(b, []byte(`"id": "s2"`))+5])
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(b)) }

func cellOf(t *testing.T, rep *Report, cloud, typ, zone string) *CellRow {
	t.Helper()
	for i := range rep.Cells {
		if rep.Cells[i].Key == (Key{cloud, typ, zone}) {
			return &rep.Cells[i]
		}
	}
	t.Fatalf("no cell %s/%s/%s in %+v", cloud, typ, zone, rep.Cells)
	return nil
}

func runOf(t *testing.T, rep *Report, id string) *RunRow {
	t.Helper()
	for i := range rep.Runs {
		if rep.Runs[i].ID == id {
			return &rep.Runs[i]
		}
	}
	t.Fatalf("no run %s", id)
	return nil
}

const priceFile = `# instance_type,spot,on_demand
instance_type,spot,on_demand
p4d.24xlarge,10,32
gcp/a2-highgpu-1g,1.5,3.5
`

func TestFleet_Recount(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, open func(string) cloud.Store) {
		writeFleet(t, open)
		now := at(100 * time.Hour)
		s, damaged, err := Recount(t.Context(), root, now)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(damaged), 2; got != want {
			t.Fatalf("damaged=%+v, want %d", damaged, want)
		}
		if d := damaged[0]; d.Key != "broken/journal.json" || d.Counted {
			t.Errorf("damaged[0]=%+v, want broken/journal.json not counted", d)
		}
		if d := damaged[1]; d.Key != "partial/journal.json" || !d.Counted {
			t.Errorf("damaged[1]=%+v, want partial/journal.json counted", d)
		}
		byType, err := ReadPrices(strings.NewReader(priceFile))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Build(s, Options{Now: now, Prices: Prices{ByType: byType}}, "recount", damaged)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(rep.Runs), 4; got != want {
			t.Fatalf("runs=%d, want %d (train-a, train-b, eval-c, partial)", got, want)
		}
		if got, want := runOf(t, rep, "partial").MachineHours, 1.0; !near(got, want) {
			t.Errorf("partial machine hours=%v, want %v (the session before the cut)", got, want)
		}

		// us-east-1a: train-a's first session (10 h 1 min), eval-c (2 h),
		// partial (1 h); one notice, committed, lead 2 min; the 29 min gap
		// after it counts here.
		a := cellOf(t, rep, "aws", "p4d.24xlarge", "us-east-1a")
		if got, want := a.MachineHours, 13+1/60.0; !near(got, want) {
			t.Errorf("us-east-1a machine hours=%v, want %v", got, want)
		}
		if a.Runs != 3 || a.Interruptions != 1 || a.NoticeCommits != 1 {
			t.Errorf("us-east-1a runs/interruptions/commits=%d/%d/%d, want 3/1/1", a.Runs, a.Interruptions, a.NoticeCommits)
		}
		if a.LeadMedian == nil || *a.LeadMedian != 120 {
			t.Errorf("us-east-1a lead=%v, want 120 s", a.LeadMedian)
		}
		if a.BetweenPerInterruption == nil || !near(*a.BetweenPerInterruption, 29*60) {
			t.Errorf("us-east-1a between=%v, want 29 min (the gap; the session ended at the commit)", a.BetweenPerInterruption)
		}
		lo, hi := rateInterval(1, a.MachineHours, 0.9)
		if !near(*a.Rate, 1/a.MachineHours) || !near(*a.RateLow, lo) || !near(*a.RateHigh, hi) {
			t.Errorf("us-east-1a rate %v [%v, %v], want %v [%v, %v]", *a.Rate, *a.RateLow, *a.RateHigh, 1/a.MachineHours, lo, hi)
		}
		// us-east-1b: 9.5 h, no interruption: the rate's upper end is 3.0/9.5.
		b := cellOf(t, rep, "aws", "p4d.24xlarge", "us-east-1b")
		if !near(b.MachineHours, 9.5) || b.Interruptions != 0 || *b.RateLow != 0 || math.Abs(*b.RateHigh-2.9957/9.5) > 1e-3 {
			t.Errorf("us-east-1b=%+v", b.Figures)
		}
		// gcp: 7 h, one loss of 30 min and 900 steps, 1 h without a machine.
		g := cellOf(t, rep, "gcp", "a2-highgpu-1g", "us-central1-a")
		if !near(g.MachineHours, 7) || g.Interruptions != 1 || g.NoticeCommits != 0 || !near(g.LostHours, 0.5) || g.LostSteps != 900 {
			t.Errorf("gcp=%+v", g.Figures)
		}
		if g.LeadMedian != nil {
			t.Errorf("gcp lead=%v, want none (no deadline)", *g.LeadMedian)
		}
		if !near(g.Goodput, 6.5/8) {
			t.Errorf("gcp goodput=%v, want %v", g.Goodput, 6.5/8)
		}

		// Money: p4d at 10/h spot, 32/h on demand; a2 at 1.5 and 3.5.
		if !near(g.Money.Spend, 1.5*7) || !near(g.Money.Wasted, 1.5*0.5) || !near(g.Money.OnDemand, 3.5*6.5) {
			t.Errorf("gcp money=%+v", *g.Money)
		}
		if got, want := *runOf(t, rep, "train-b").Money.CostPer1kSteps, 1.5*7/20; !near(got, want) {
			t.Errorf("train-b cost per 1k steps=%v, want %v", got, want)
		}
		tot := rep.Total
		if tot.Runs != 4 || tot.Interruptions != 2 || !near(tot.MachineHours, 13+1/60.0+9.5+7) {
			t.Errorf("total=%+v", tot)
		}
		if want := 10*(13+1/60.0+9.5) + 1.5*7; !near(tot.Money.Spend, want) {
			t.Errorf("total spend=%v, want %v", tot.Money.Spend, want)
		}
		// Every run's goodput is `spotagent report`'s.
		for _, id := range []string{"train-a", "train-b", "eval-c"} {
			j, err := journal.Read(t.Context(), open(id), id)
			if err != nil {
				t.Fatal(err)
			}
			gp, err := journal.Account(j, now)
			if err != nil {
				t.Fatal(err)
			}
			m := gp.Cost(10, 32)
			r := runOf(t, rep, id)
			if !near(r.Goodput, gp.Ratio) {
				t.Errorf("%s goodput=%v, report says %v", id, r.Goodput, gp.Ratio)
			}
			if id != "train-b" && (!near(r.Money.Spend, m.Spend) || !near(r.Money.Wasted, m.Wasted) || !near(r.Money.OnDemand, m.OnDemand)) {
				t.Errorf("%s money=%+v, report says %+v", id, *r.Money, m)
			}
		}
		// The forecast window is the 100 h since the first run: 30 days of
		// that usage is 7.2× what was spent.
		if !near(tot.Money.Forecast30d, tot.Money.Spend*30*24/100) {
			t.Errorf("forecast=%v, want %v", tot.Money.Forecast30d, tot.Money.Spend*30*24/100)
		}
	})
}

func TestFleet_Filters(t *testing.T) {
	stores(t, func(t *testing.T, root cloud.Store, open func(string) cloud.Store) {
		writeFleet(t, open)
		now := at(100 * time.Hour)
		s, damaged, err := Recount(t.Context(), root, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			o    Options
			runs []string
		}{
			{Options{RunIDs: []string{"train-*"}}, []string{"train-a", "train-b"}},
			{Options{RunIDs: []string{"eval-?", "partial"}}, []string{"partial", "eval-c"}},
			{Options{Since: 30 * time.Hour}, []string{"eval-c"}}, // ended 26 h before now
		} {
			c.o.Now = now
			rep, err := Build(s, c.o, "recount", damaged)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rep.Runs {
				got = append(got, r.ID)
			}
			if strings.Join(got, ",") != strings.Join(c.runs, ",") {
				t.Errorf("%+v: runs %v, want %v", c.o, got, c.runs)
			}
		}
		if _, err := Build(s, Options{RunIDs: []string{"[x"}}, "", nil); err == nil {
			t.Error("a bad glob was accepted")
		}
	})
}

func TestFleet_Formats(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFleet(t, func(dir string) cloud.Store {
		s, err := file.New(filepath.Join(st.Root(), dir))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
	now := at(100 * time.Hour)
	s, damaged, err := Recount(t.Context(), st, now)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Build(s, Options{Now: now, Prices: Prices{Default: Price{Spot: 2, OnDemand: 6}}}, "recount", damaged)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("table", func(t *testing.T) {
		var b bytes.Buffer
		if err := Write(&b, rep, "wide"); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + b.String())
		for _, want := range []string{"us-central1-a", "RATE/H (90 %)", "train-b", "damaged journal broken/journal.json (not counted)",
			"damaged journal partial/journal.json (the rest counted)", "forecast for the next 30 days", "1/1"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("table lacks %q:\n%s", want, b.String())
			}
		}
	})
	t.Run("json", func(t *testing.T) {
		var b bytes.Buffer
		if err := Write(&b, rep, "json"); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(b.Bytes(), &back); err != nil {
			t.Fatal(err)
		}
		if back.Total.Interruptions != 2 || len(back.Cells) != 3 || len(back.Runs) != 4 || back.Total.Money == nil || len(back.Damaged) != 2 {
			t.Errorf("json round trip: %+v", back.Total)
		}
	})
	t.Run("csv", func(t *testing.T) {
		var b bytes.Buffer
		if err := Write(&b, rep, "csv"); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&b).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(rows), 1+3+4+1; got != want {
			t.Fatalf("csv rows=%d, want %d", got, want)
		}
		last := rows[len(rows)-1]
		if last[0] != "fleet" || last[10] != "2" || last[slices.Index(csvHead, "spend")] == "" {
			t.Errorf("fleet row=%v", last)
		}
	})
	if err := Write(&bytes.Buffer{}, rep, "xml"); err == nil {
		t.Error("format xml accepted")
	}
}

func TestReadPrices_Errors(t *testing.T) {
	for _, in := range []string{"p4d,x,1", "p4d", "p4d,-1,2", "a,1,2,3"} {
		if _, err := ReadPrices(strings.NewReader(in)); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
