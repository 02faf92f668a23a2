package fleetsynth

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/fleet"
)

// TestJournal: a synthetic run is 1–6 sessions of one instance type, in
// order, each ended, a restore between two, and the same seed the same run.
func TestJournal(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 50 {
		j, step, end := Journal(rand.New(rand.NewPCG(1, uint64(i))), i, base)
		if n := len(j.Sessions); n < 1 || n > 6 || len(j.Restores) != n-1 {
			t.Fatalf("run %d: %d sessions, %d restores", i, n, len(j.Restores))
		}
		prev := base
		for _, s := range j.Sessions {
			if s.Instance.InstanceType != j.Sessions[0].Instance.InstanceType || s.Start.Before(prev) || s.End == nil || !s.End.After(s.Start) {
				t.Fatalf("run %d: session %+v out of order or of another type", i, s)
			}
			prev = *s.End
		}
		if step <= 0 || end.Before(prev) {
			t.Fatalf("run %d: step %d, end %s before the last session's %s", i, step, end, prev)
		}
		again, _, _ := Journal(rand.New(rand.NewPCG(1, uint64(i))), i, base)
		a, _ := json.Marshal(j)
		b, _ := json.Marshal(again)
		if string(a) != string(b) {
			t.Fatalf("run %d: the same seed gave another journal", i)
		}
	}
}

// TestWrite: n runs, each a journal the journal package reads and a
// latest.json naming its newest step; Prices prices every type.
func TestWrite(t *testing.T) {
	root := t.TempDir()
	if err := Write(root, 3); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 3 {
		t.Fatalf("%d runs written, want 3", len(ents))
	}
	for _, e := range ents {
		var j journal.Journal
		var l checkpoint.Latest
		jb, _ := os.ReadFile(filepath.Join(root, e.Name(), checkpoint.JournalKey))
		lb, _ := os.ReadFile(filepath.Join(root, e.Name(), checkpoint.LatestKey))
		if json.Unmarshal(jb, &j) != nil || j.RunID != e.Name() || json.Unmarshal(lb, &l) != nil || l.Step <= 0 {
			t.Fatalf("%s: journal %q, latest %+v", e.Name(), j.RunID, l)
		}
		if !strings.Contains(Prices(), j.Sessions[0].Instance.InstanceType+",") {
			t.Fatalf("prices.csv lacks %s", j.Sessions[0].Instance.InstanceType)
		}
	}
}

// TestOldSummary: the summary before issue 40, on a real file store:
// written whole, a session recorded into it by compare-and-swap, the
// prior and the report read from it.
func TestOldSummary(t *testing.T) {
	ctx := context.Background()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PutOldSummary(ctx, st, 20); err != nil {
		t.Fatal(err)
	}
	j, step, _ := Journal(rand.New(rand.NewPCG(7, 7)), 99, time.Now().Add(-30*24*time.Hour))
	if err := RecordOldSession(ctx, st, "extra", j, step); err != nil {
		t.Fatal(err)
	}
	s, ver, err := ReadOldSummary(ctx, st)
	if err != nil || ver == "" {
		t.Fatalf("read: %v, version %q", err, ver)
	}
	if len(s.Runs) != 21 || s.Runs["extra"] == nil {
		t.Fatalf("%d runs, extra %v: want 21 with extra", len(s.Runs), s.Runs["extra"])
	}
	in := j.Sessions[0].Instance
	p, err := OldPrior(ctx, st, fleet.Key{Cloud: in.Cloud, InstanceType: in.InstanceType, Zone: in.Zone})
	if err != nil || p.Hours <= 0 {
		t.Fatalf("prior %+v, %v: want hours behind it", p, err)
	}
	if err := OldReport(ctx, st); err != nil {
		t.Fatal(err)
	}
}
