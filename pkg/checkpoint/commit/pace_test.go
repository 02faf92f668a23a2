package commit

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"go.uber.org/zap"
)

// The pace tries early uploads, then the serial path, then keeps the
// faster per byte, re-measuring the slower one every reprobeEvery-th
// pipeline; small checkpoints are not scored.
func TestEarlyPace_Decides(t *testing.T) {
	const gib = 1 << 30
	var e earlyPace
	if !e.early() {
		t.Fatal("first pipeline: want early uploads")
	}
	e.record(true, paceMinBytes-1, time.Hour) // too small to count
	if !e.early() {
		t.Fatal("a small checkpoint was scored")
	}
	// Early: 1 GiB durable 3.38 s after the first saved; serial: 3.21 s
	// (issue 30's measurement).
	e.record(true, gib, 3380*time.Millisecond)
	if e.early() {
		t.Fatal("after an early score only: want the serial path measured")
	}
	e.record(false, gib, 3210*time.Millisecond)
	for range 4 {
		if e.early() {
			t.Fatal("early uploads were slower: want the serial path")
		}
	}
	if !e.early() { // the 8th pipeline re-measures the slower choice
		t.Fatal("want the slower choice re-measured every 8th pipeline")
	}
	// On a machine where overlapping pays (2.71 s against 3.75 s), the
	// new early scores win it back.
	e.record(true, gib, 2200*time.Millisecond)
	if !e.early() {
		t.Fatalf("early now faster per byte (%v): want early uploads", e.perByte)
	}
	// Per byte: a 4 GiB serial score of 8 s (2 s/GiB) beats early's
	// ~2.79 s/GiB.
	e.record(false, 4*gib, 8*time.Second)
	e.record(false, 4*gib, 8*time.Second)
	if e.early() {
		t.Fatalf("serial faster per byte (%v): want the serial path", e.perByte)
	}
}

// A pipeline the pace defers uploads nothing before done, and its commit
// uploads the files all the same.
func TestEarlyPace_DeferredPipelineUploadsAtDone(t *testing.T) {
	st := cptest.NewStore(t)
	c := &Committer{Store: st, RunID: "run"}
	c.paceState().perByte = [2]float64{1e-9, 2e-9} // early measured slower
	c.paceState().n = 1
	dir := cptest.WriteDir(t, map[string]string{"a": "alpha", "b": "beta"})
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	p := c.NewPipeline(context.Background(), root, 5, "x")
	if p.pace.early || !p.lazy {
		t.Fatalf("pipeline early=%v lazy=%v, want deferred", p.pace.early, p.lazy)
	}
	if err := p.Add("a"); err != nil {
		t.Fatal(err)
	}
	p.wg.Wait()
	if _, err := st.Stat(context.Background(), checkpoint.Prefix(5, "x")+"a"); err == nil {
		t.Fatal("a deferred pipeline uploaded before done")
	}
	res, err := c.Commit(context.Background(), Request{Dir: dir, Root: root, ID: "x", Step: 5, Reason: "periodic", Pipeline: p})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if len(res.Manifest.Files) != 2 {
		t.Fatalf("manifest lists %d files, want 2", len(res.Manifest.Files))
	}
	if got := restoredStep(t, st); got != 5 {
		t.Fatalf("restored %d, want 5", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
}

// TestOnStore_CopiesAllButTheStore: OnStore's committer is c's on another
// store, sharing c's pace (zero-code mode's committer, whose uploads count
// for the same machine), built field by field since a Committer holds a
// sync.Once: a field added to Committer must be added to OnStore and here.
func TestOnStore_CopiesAllButTheStore(t *testing.T) {
	c := &Committer{Store: cptest.NewStore(t), RunID: "run", Source: checkpoint.Machine{Cloud: "aws", InstanceID: "i-1"},
		Concurrency: 3, Gate: NewGate(1), Log: zap.NewNop(), Lease: &checkpoint.Lease{}, PartLease: &checkpoint.Lease{}, Session: "s1"}
	other := cptest.NewStore(t)
	d := c.OnStore(other)
	if d.Store != other {
		t.Fatal("OnStore: the store is not the one given")
	}
	cv, dv := reflect.ValueOf(c).Elem(), reflect.ValueOf(d).Elem()
	var names []string
	for i := range cv.NumField() {
		f := cv.Type().Field(i)
		names = append(names, f.Name)
		if !f.IsExported() || f.Name == "Store" {
			continue
		}
		if cv.Field(i).IsZero() {
			t.Fatalf("set %s in this test", f.Name)
		}
		if !reflect.DeepEqual(cv.Field(i).Interface(), dv.Field(i).Interface()) {
			t.Errorf("OnStore: %s not copied", f.Name)
		}
	}
	want := []string{"Store", "RunID", "Source", "Concurrency", "Gate", "Log", "Lease", "PartLease", "Session", "paceOnce", "pace"}
	if !slices.Equal(names, want) {
		t.Errorf("Committer's fields %v, this test and OnStore know %v", names, want)
	}
	if d.paceState() != c.paceState() {
		t.Error("OnStore's committer has a pace of its own")
	}
}
