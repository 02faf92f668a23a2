package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// rotatingTrainer is a shell trainer with no agent code that saves an HF
// layout checkpoint-<step>/ every period (trainer_state.json last) and
// deletes the previous one right after, as save_total_limit=1 does.
func rotatingTrainer(out, period string) []string {
	script := `i=0; while :; do i=$((i+10)); d="$OUT/checkpoint-$i"; mkdir -p "$d"; ` +
		`head -c 65536 /dev/urandom > "$d/pytorch_model.bin"; echo "{\"global_step\": $i}" > "$d/trainer_state.json"; ` +
		`rm -rf "$OUT/checkpoint-$((i-10))"; echo "saved step $i"; sleep ` + period + `; done`
	return []string{"--", "/usr/bin/env", "OUT=" + out, "/bin/sh", "-c", script}
}

// TestWatch_Sidecar: spotagent sidecar --watch DIR beside a trainer it
// did not start (here a shell loop rotating its checkpoints). It commits
// them as they come; on SIGTERM (the kubelet's) it commits the newest
// complete one before it exits, and a new machine's sidecar restores it
// into an empty DIR under its name.
func TestWatch_Sidecar(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	out := mkdir(t, filepath.Join(dir, "out"))
	args := watchArgs(dir, out, store, "--cloud", "none")
	args[0] = "sidecar"
	sc := start(t, nil, args...)
	sc.waitLine(`zero-code mode: watching`, time.Minute)
	targs := rotatingTrainer(out, "0.5")[1:]
	tr := startCmd(t, exec.Command(targs[0], targs[1:]...))
	sc.waitLine(`checkpoint committed`, time.Minute)
	tr.waitLine(`saved step 50`, time.Minute)
	tr.signal(syscall.SIGKILL) // the trainer is gone (a drained pod), perhaps half-way through a save
	tr.wait(time.Minute)
	want := newestComplete(t, out)
	sc.waitLine(`checkpoint committed.*"step": `+strconv.FormatInt(want, 10), time.Minute)
	sc.signal(syscall.SIGTERM)
	code := sc.wait(time.Minute)
	if code != 0 && code != exitInterrupted {
		t.Fatalf("sidecar exit code %d", code)
	}
	st := openTestStore(t, store, all.Options{})
	if l := readLatestPointer(t, st); l.Step != want {
		t.Fatalf("latest step %d, want %d (the trainer's last checkpoint)", l.Step, want)
	}
	// A new machine: the sidecar restores it into an empty DIR.
	dir2 := testutil.ShortDir(t)
	out2 := mkdir(t, filepath.Join(dir2, "out"))
	args2 := watchArgs(dir2, out2, store, "--cloud", "none")
	args2[0] = "sidecar"
	sc2 := start(t, nil, args2...)
	sc2.waitLine(`restored checkpoint into the watched directory`, time.Minute)
	if _, err := os.Stat(filepath.Join(out2, "checkpoint-"+strconv.FormatInt(want, 10), "trainer_state.json")); err != nil {
		t.Fatalf("not restored under its name: %v", err)
	}
	sc2.signal(syscall.SIGTERM)
	sc2.wait(time.Minute)
}

// newestComplete is the step of the newest checkpoint-<step> in out that
// holds trainer_state.json.
func newestComplete(t *testing.T, out string) int64 {
	t.Helper()
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	best := int64(-1)
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "checkpoint-")
		s, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil || s <= best {
			continue
		}
		if _, err := os.Stat(filepath.Join(out, e.Name(), "trainer_state.json")); err == nil {
			best = s
		}
	}
	if best < 0 {
		t.Fatal("no complete checkpoint in " + out)
	}
	return best
}
