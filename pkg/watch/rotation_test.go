package watch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestVerify_Rotation: a trainer with save_total_limit deletes a
// checkpoint while its staged copy is being uploaded. The staged hard
// links still hold the complete data: Verify passes and the commit lands,
// with the data as it was found complete.
func TestVerify_Rotation(t *testing.T) {
	for _, kind := range []string{"dir", "file", "partly-deleted"} {
		t.Run(kind, func(t *testing.T) {
			cfg := Config{}
			name := "checkpoint-4"
			if kind == "file" {
				cfg.Pattern, name = "*.pt", "model-4.pt"
			}
			w, _ := newWatcher(t, cfg)
			p := filepath.Join(w.cfg.Dir, name)
			if kind == "file" {
				testutil.WriteFile(t, p, "weights4")
			} else {
				testutil.WriteFile(t, filepath.Join(p, "pytorch_model.bin"), "weights4")
				testutil.WriteFile(t, filepath.Join(p, "sub", "optimizer.pt"), "opt4")
				testutil.WriteFile(t, filepath.Join(p, HFMarker), "{}")
			}
			t0 := time.Now()
			w.Scan(t0)
			cps := w.Scan(t0.Add(time.Hour))
			if len(cps) != 1 {
				t.Fatal("not complete")
			}
			cp := cps[0]
			fst, _ := file.New(t.TempDir())
			vs := NewVerifyStore(fst)
			stage := stageIn(t, cp, "r1")
			// Rotation: the trainer's next save deletes this one.
			if kind == "partly-deleted" {
				os.Remove(filepath.Join(p, "pytorch_model.bin"))
			} else if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := cp.Verify(); err != nil {
				t.Fatalf("Verify after the original was deleted: %v", err)
			}
			defer vs.Expect(cp.Step, "r1", cp.Verify)()
			c := &commit.Committer{Store: vs, RunID: "r"}
			if _, err := c.Commit(t.Context(), commit.Request{Dir: stage, ID: "r1", Step: cp.Step, Metadata: cp.Metadata()}); err != nil {
				t.Fatalf("commit of a rotated checkpoint: %v", err)
			}
			l, err := checkpoint.ReadLatest(t.Context(), fst)
			if err != nil || l.Step != 4 {
				t.Fatalf("latest %+v, %v", l, err)
			}
		})
	}
}

// TestVerify_RotationThenRewrite: deleting the original is no change; a
// write into the staged data through the original name before it, or a
// new checkpoint of the same name made meanwhile, is.
func TestVerify_RotationThenRewrite(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone})
	p := filepath.Join(w.cfg.Dir, "checkpoint-1")
	testutil.WriteFile(t, filepath.Join(p, "a.bin"), "aaaa")
	t0 := time.Now()
	w.Scan(t0)
	cps := w.Scan(t0.Add(time.Hour))
	stageIn(t, cps[0], "s1")
	f, _ := os.OpenFile(filepath.Join(p, "a.bin"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("more")
	f.Close()
	os.RemoveAll(p)
	if err := cps[0].Verify(); !errors.Is(err, ErrChanged) {
		t.Fatalf("Verify after a write then a delete: %v, want ErrChanged", err)
	}

	w2, _ := newWatcher(t, Config{Marker: markerNone})
	p2 := filepath.Join(w2.cfg.Dir, "checkpoint-2")
	testutil.WriteFile(t, filepath.Join(p2, "a.bin"), "aaaa")
	w2.Scan(t0)
	cps = w2.Scan(t0.Add(time.Hour))
	stageIn(t, cps[0], "s2")
	os.RemoveAll(p2)
	testutil.WriteFile(t, filepath.Join(p2, "a.bin"), "bbbb") // saved again under the same name
	if err := cps[0].Verify(); !errors.Is(err, ErrChanged) {
		t.Fatalf("Verify with a new checkpoint of the same name: %v, want ErrChanged", err)
	}
}

// TestScan_MarkerShortQuiet: a trainer saving every 3 s with the default
// 10 s quiet window: a checkpoint holding its marker is complete after
// the short marker window, not the full one.
func TestScan_MarkerShortQuiet(t *testing.T) {
	w, _ := newWatcher(t, Config{Quiet: 10 * time.Second})
	d := filepath.Join(w.cfg.Dir, "checkpoint-3")
	testutil.WriteFile(t, filepath.Join(d, "pytorch_model.bin"), "w")
	t0 := time.Now()
	w.Scan(t0)
	testutil.WriteFile(t, filepath.Join(d, HFMarker), "{}")
	w.Scan(t0.Add(100 * time.Millisecond))
	if got := w.Scan(t0.Add(100*time.Millisecond + defaultMarkerQuiet/2)); len(got) != 0 {
		t.Fatalf("reported within the marker window: %s", names(got))
	}
	got := w.Scan(t0.Add(100*time.Millisecond + defaultMarkerQuiet))
	if names(got) != "checkpoint-3" {
		t.Fatalf("got %q %s after the marker's quiet window, want checkpoint-3", names(got), w.state["checkpoint-3"].problem)
	}
}

// TestScan_NewerMeansDone: without a marker, a newer checkpoint appearing
// says the older one is complete once a scan saw it unchanged, long
// before the quiet window; the newest waits for its window.
func TestScan_NewerMeansDone(t *testing.T) {
	w, _ := newWatcher(t, Config{Pattern: "*.pt", Quiet: time.Minute})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "model-3.pt"), "three")
	t0 := time.Now()
	w.Scan(t0)
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "model-6.pt"), "six")
	got := w.Scan(t0.Add(time.Second))
	if names(got) != "model-3.pt" {
		t.Fatalf("got %q, want model-3.pt once model-6.pt appeared", names(got))
	}
	if got := w.Scan(t0.Add(2 * time.Second)); len(got) != 0 {
		t.Fatalf("the newest reported before its quiet window: %s", names(got))
	}
	// One first seen with a newer one already there still needs a scan
	// that sees it unchanged.
	w2, _ := newWatcher(t, Config{Pattern: "*.pt", Quiet: time.Minute})
	testutil.WriteFile(t, filepath.Join(w2.cfg.Dir, "model-3.pt"), "three")
	testutil.WriteFile(t, filepath.Join(w2.cfg.Dir, "model-6.pt"), "six")
	if got := w2.Scan(t0); len(got) != 0 {
		t.Fatalf("reported at first sight: %s", names(got))
	}
	if got := w2.Scan(t0.Add(time.Second)); names(got) != "model-3.pt" {
		t.Fatalf("got %q, want model-3.pt", names(got))
	}
}

// TestScan_DeadlineShrinksQuiet: under a notice's upload deadline a
// checkpoint without a marker is complete at the deadline at the latest,
// not after the full quiet window.
func TestScan_DeadlineShrinksQuiet(t *testing.T) {
	w, _ := newWatcher(t, Config{Pattern: "*.pt", Quiet: time.Minute})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "model-3.pt"), "three")
	t0 := time.Now()
	w.Scan(t0)
	w.SetDeadline(t0.Add(3 * time.Second))
	if got := w.Scan(t0.Add(2 * time.Second)); len(got) != 0 {
		t.Fatalf("reported before the deadline: %s", names(got))
	}
	if got := w.Scan(t0.Add(3 * time.Second)); names(got) != "model-3.pt" {
		t.Fatalf("got %q at the deadline, want model-3.pt", names(got))
	}
}

// TestCreateDir_OtherOwner: a directory that appears, owned by another
// user, while the agent creates DIR is refused.
func TestCreateDir_OtherOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory of another user")
	}
	d := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := createDir(d); err == nil {
		t.Fatal("another user's directory accepted as the one the agent created")
	}
}

// TestRun_WalksOnlyWhatChanged: with filesystem events, an idle DIR is
// not walked again every rescan period; a write into one checkpoint
// walks that one only, and it is still reported once complete.
func TestRun_WalksOnlyWhatChanged(t *testing.T) {
	w, _ := newWatcher(t, Config{Marker: markerNone, Quiet: 200 * time.Millisecond, Rescan: 50 * time.Millisecond})
	for _, n := range []string{"checkpoint-1", "checkpoint-2", "checkpoint-3"} {
		testutil.WriteFile(t, filepath.Join(w.cfg.Dir, n, "a.bin"), n)
	}
	var mu sync.Mutex
	walks := map[string]int{}
	testHookSnapshot = func(name string) {
		mu.Lock()
		walks[name]++
		mu.Unlock()
	}
	t.Cleanup(func() { testHookSnapshot = nil })
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return walks[name]
	}
	out := make(chan *Checkpoint, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, out) }()
	t.Cleanup(func() { cancel(); <-done })
	got := map[string]bool{}
	for len(got) < 3 {
		select {
		case c := <-out:
			got[c.Name] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("reported %v, want all three", got)
		}
	}
	before := count("checkpoint-1")
	idle := time.Now()
	for time.Since(idle) < time.Second { // 20 rescan periods
		time.Sleep(50 * time.Millisecond) // letting idle time pass, not synchronisation
	}
	if n := count("checkpoint-1") - before; n > 1 {
		t.Fatalf("an unchanged checkpoint was walked %d times in 20 idle rescan periods, want at most once", n)
	}
	b1, b3 := count("checkpoint-1"), count("checkpoint-3")
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-3", "b.bin"), "more")
	select {
	case c := <-out:
		if c.Name != "checkpoint-3" || c.fp.files() != 2 {
			t.Fatalf("got %s with %d files, want checkpoint-3 with 2", c.Name, c.fp.files())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the changed checkpoint was not reported again")
	}
	if count("checkpoint-3") == b3 {
		t.Fatal("the changed checkpoint was not walked")
	}
	if n := count("checkpoint-1") - b1; n > 1 {
		t.Fatalf("an unchanged checkpoint was walked %d times for a write elsewhere", n)
	}
}

// TestRun_RotationEverySecond: an HF trainer saving every second with
// save_total_limit=1 (each checkpoint deleted about a second after its
// marker) under the default 10 s quiet window: the watcher reports the
// checkpoints while they exist, so that the agent can stage them.
func TestRun_RotationEverySecond(t *testing.T) {
	w, _ := newWatcher(t, Config{Quiet: 10 * time.Second})
	out := make(chan *Checkpoint, 64)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, out) }()
	t.Cleanup(func() { cancel(); <-done })
	staged := 0
	for i := 1; i <= 6; i++ {
		d := filepath.Join(w.cfg.Dir, fmt.Sprintf("checkpoint-%d", i*20))
		testutil.WriteFile(t, filepath.Join(d, "pytorch_model.bin"), "w")
		testutil.WriteFile(t, filepath.Join(d, "optimizer.pt"), "o")
		testutil.WriteFile(t, filepath.Join(d, HFMarker), "{}")
		if i > 1 {
			os.RemoveAll(filepath.Join(w.cfg.Dir, fmt.Sprintf("checkpoint-%d", (i-1)*20)))
		}
		end := time.Now().Add(time.Second)
		for time.Now().Before(end) { // the trainer's next second of training
			select {
			case c := <-out:
				if err := c.StageIn(w.root, ".stage/"+c.Name); err == nil {
					staged++
				} else {
					t.Logf("stage %s: %v", c.Name, err)
				}
			case <-time.After(time.Until(end)):
			}
		}
	}
	if staged < 3 {
		t.Fatalf("staged %d of 6 checkpoints saved every second, want most", staged)
	}
}
