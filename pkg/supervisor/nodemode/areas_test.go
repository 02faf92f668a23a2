package nodemode

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// areasRoot is a checkpoint root with a pruner on it whose clock is t0
// (moved by the test), deleting at once (no goroutine).
type areasRoot struct {
	dir  string
	t0   time.Time
	now  time.Time
	p    *areaPruner
	logs *observer.ObservedLogs
}

func newAreasRoot(t *testing.T, ttl time.Duration) *areasRoot {
	t.Helper()
	a := &areasRoot{dir: t.TempDir(), t0: time.Now().Truncate(time.Second)}
	a.now = a.t0
	root, err := os.OpenRoot(a.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	core, logs := observer.New(zap.InfoLevel)
	a.logs = logs
	a.p = &areaPruner{root: root, ttl: ttl, now: func() time.Time { return a.now }, spawn: func(f func()) { f() }, log: zap.New(core)}
	return a
}

// area makes run key's area as an agent leaves it: the marker, a 64 KiB
// kept copy in committed/ and restore/, the area last changed at
// age before t0 and committed/ at tierAge before t0.
func (a *areasRoot) area(t *testing.T, key string, age, tierAge time.Duration) string {
	t.Helper()
	id, _, _ := strings.Cut(key, "/")
	p := filepath.Join(a.dir, filepath.FromSlash(key), localdirs.AreaPrefix+id)
	kept := filepath.Join(p, localdirs.TierSub, "000000000040-0123456789ab")
	for _, d := range []string{kept, filepath.Join(p, localdirs.RestoreSub)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(p, localdirs.AreaMarker), []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kept, "model.pt"), randomBytes(64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	for sub, ago := range map[string]time.Duration{localdirs.TierSub: tierAge, localdirs.RestoreSub: age, "": age} {
		at := a.t0.Add(-ago)
		if err := os.Chtimes(filepath.Join(p, sub), at, at); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// removed is the runs whose areas the pruner logged as removed, by key,
// with their log fields.
func (a *areasRoot) removed() map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, e := range a.logs.FilterMessage("node: removed a finished run's area").All() {
		m := e.ContextMap()
		out[m["run"].(string)] = m
	}
	return out
}

// TestAreas_PruneByAge: the areas of runs the node does not host whose
// last use (the newest of the area, restore/ and committed/) is the TTL
// old go, one log line each (run, bytes, age); a hosted run's area stays
// however old, as do recent ones, a directory without the run's marker,
// and whatever a symlink in the root points at.
func TestAreas_PruneByAge(t *testing.T) {
	a := newAreasRoot(t, 24*time.Hour)
	old := a.area(t, "old", 25*time.Hour, 25*time.Hour)
	recentTier := a.area(t, "busy", 48*time.Hour, time.Hour)
	recent := a.area(t, "recent", time.Hour, 2*time.Hour)
	hosted := a.area(t, "hosted", 48*time.Hour, 48*time.Hour)
	part0 := a.area(t, "job/node-0", 30*time.Hour, 30*time.Hour)
	part1 := a.area(t, "job/node-1", 30*time.Hour, 30*time.Hour)
	noMarker := a.area(t, "nomarker", 48*time.Hour, 48*time.Hour)
	os.Remove(filepath.Join(noMarker, localdirs.AreaMarker))
	wrongMarker := a.area(t, "wrong", 48*time.Hour, 48*time.Hour)
	os.WriteFile(filepath.Join(wrongMarker, localdirs.AreaMarker), []byte("other\n"), 0o600)
	// A pod plants symlinks: the root's entry for a run, and a run's area.
	outside := t.TempDir()
	outRun := filepath.Join(outside, "evil")
	outArea := filepath.Join(outRun, localdirs.AreaPrefix+"evil")
	os.MkdirAll(outArea, 0o700)
	os.WriteFile(filepath.Join(outArea, localdirs.AreaMarker), []byte("evil"), 0o600)
	old48 := a.t0.Add(-48 * time.Hour)
	os.Chtimes(outArea, old48, old48)
	if err := os.Symlink(outRun, filepath.Join(a.dir, "evil")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(a.dir, "sneaky"), 0o700)
	if err := os.Symlink(outArea, filepath.Join(a.dir, "sneaky", localdirs.AreaPrefix+"sneaky")); err != nil {
		t.Fatal(err)
	}

	a.p.prune(map[string]bool{"hosted": true, "job/node-1": true})

	got := a.removed()
	if len(got) != 2 || got["old"] == nil || got["job/node-0"] == nil {
		t.Fatalf("removed %v, want the areas of old and job/node-0", got)
	}
	if age := got["old"]["age_s"]; age != int64(25*3600) {
		t.Fatalf("old's age_s %v, want %d", age, 25*3600)
	}
	if b := got["old"]["bytes"].(int64); b < 64<<10 {
		t.Fatalf("old's bytes %d, want at least its 64 KiB copy", b)
	}
	for _, p := range []string{old, part0, filepath.Join(a.dir, "old"), filepath.Join(a.dir, "job", "node-0")} {
		if exists(p) {
			t.Errorf("%s is still there", p)
		}
	}
	for _, p := range []string{recentTier, recent, hosted, part1, noMarker, wrongMarker, filepath.Join(outArea, localdirs.AreaMarker)} {
		if !exists(p) {
			t.Errorf("%s was removed", p)
		}
	}
	if ents, _ := filepath.Glob(filepath.Join(a.dir, prunedPrefix+"*")); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

// TestAreas_DiskShortOfSpace: with the filesystem short of free space,
// areas of runs not hosted go oldest first, before the TTL, until
// areaMinFree of it is free; a hosted run's area stays, and so does one
// used within areaDiskGrace (a whole-job restart's).
func TestAreas_DiskShortOfSpace(t *testing.T) {
	a := newAreasRoot(t, 24*time.Hour)
	first := a.area(t, "r1", 3*time.Hour, 3*time.Hour)
	second := a.area(t, "r2", 2*time.Hour, 2*time.Hour)
	third := a.area(t, "r3", time.Hour, time.Hour)
	hosted := a.area(t, "hosted", 5*time.Hour, 5*time.Hour)
	b := diskBytes(a.p.root, "r1/"+localdirs.AreaPrefix+"r1")
	// Nothing free; 1.5 areas' bytes wanted: two areas go.
	total := uint64(float64(b) * 1.5 / areaMinFree)
	a.p.free = func() (uint64, uint64, error) { return 0, total, nil }

	a.p.prune(map[string]bool{"hosted": true})

	got := a.removed()
	if len(got) != 2 || got["r1"] == nil || got["r2"] == nil || got["r1"]["why"] != "disk short of free space" {
		t.Fatalf("removed %v, want r1 and r2 for disk space", got)
	}
	if exists(first) || exists(second) || !exists(third) || !exists(hosted) {
		t.Fatalf("after: r1 %v r2 %v r3 %v hosted %v, want only r3 and hosted", exists(first), exists(second), exists(third), exists(hosted))
	}

	// No space at all: r3 goes, but not a run that ended a minute ago.
	a.p.free = func() (uint64, uint64, error) { return 0, 1 << 40, nil }
	restarting := a.area(t, "restarting", time.Minute, time.Minute)
	a.p.prune(map[string]bool{"hosted": true})
	if exists(third) || !exists(restarting) || !exists(hosted) {
		t.Fatalf("after: r3 %v restarting %v hosted %v, want restarting and hosted only", exists(third), exists(restarting), exists(hosted))
	}
}

// TestAreas_TouchAndLeftovers: a run that just ended is used now (its
// area is kept for the TTL from then, however old its files), and areas
// an earlier node agent took out but did not delete are deleted.
func TestAreas_TouchAndLeftovers(t *testing.T) {
	a := newAreasRoot(t, time.Hour)
	p := a.area(t, "ended", 48*time.Hour, 48*time.Hour)
	left := filepath.Join(a.dir, prunedPrefix+"0123456789ab")
	os.MkdirAll(filepath.Join(left, "committed"), 0o700)
	os.WriteFile(filepath.Join(left, "committed", "x"), []byte("x"), 0o600)

	a.p.leftovers()
	a.p.touch("ended")
	a.now = a.t0.Add(time.Hour - time.Second)
	a.p.prune(nil)
	if exists(left) || !exists(p) {
		t.Fatalf("leftover there %v, touched area there %v: want gone, there", exists(left), exists(p))
	}
	a.now = a.t0.Add(time.Hour)
	a.p.prune(nil)
	if exists(p) || a.removed()["ended"]["age_s"] != int64(3600) {
		t.Fatalf("area there %v, removed %v: want gone an hour after its run ended", exists(p), a.removed())
	}
}

// TestNode_FinishedRunAreaPruned: a run ends, and once the TTL has passed
// since, the end of another run removes its area; the area of a run the
// node still hosts stays, however old by the clock, as does the area of
// the run that just ended.
func TestNode_FinishedRunAreaPruned(t *testing.T) {
	var ahead atomic.Int64 // how far the node's clock is ahead of time.Now
	n := startNode(t, nil, func(c *Config) {
		c.AreaTTL = time.Hour
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		c.diskFree = func() (uint64, uint64, error) { return 1 << 40, 1 << 40, nil } // ample: age alone decides
	})
	ckpt := filepath.Join(filepath.Dir(n.sock), "ckpt")
	areaOf := func(run string) string { return filepath.Join(ckpt, run, localdirs.AreaPrefix+run) }
	ended := func(run string) func() bool {
		return func() bool {
			for _, e := range n.logs.FilterMessage("node: run done").All() {
				if e.ContextMap()["run"] == run {
					return true
				}
			}
			return false
		}
	}

	gone := n.dialAs(t, "pod:a")
	helloRun(gone, "gone")
	gone.Expect(protocol.TypeWelcome)
	gone.Close()
	testutil.WaitFor(t, "run gone to end", ended("gone"))
	stays := n.dialAs(t, "pod:b")
	helloRun(stays, "stays")
	stays.Expect(protocol.TypeWelcome)
	if !exists(areaOf("gone")) || !exists(areaOf("stays")) {
		t.Fatalf("areas of gone %v, stays %v: want both", exists(areaOf("gone")), exists(areaOf("stays")))
	}

	ahead.Store(int64(2 * time.Hour))
	last := n.dialAs(t, "pod:c")
	helloRun(last, "last")
	last.Expect(protocol.TypeWelcome)
	last.Close()
	testutil.WaitFor(t, "gone's area to be removed", func() bool { return !exists(areaOf("gone")) })
	removed := n.logs.FilterMessage("node: removed a finished run's area").All()
	if len(removed) != 1 || removed[0].ContextMap()["run"] != "gone" {
		t.Fatalf("removed %v, want gone's area only", removed)
	}
	if !exists(areaOf("stays")) || !exists(areaOf("last")) {
		t.Fatalf("areas of stays %v, last %v: want both kept", exists(areaOf("stays")), exists(areaOf("last")))
	}
	// The run comes back: a new area, restored from the store.
	back := n.dialAs(t, "pod:a")
	helloRun(back, "gone")
	back.Expect(protocol.TypeWelcome)
	if !exists(areaOf("gone")) {
		t.Fatal("gone's area was not made again")
	}
}
