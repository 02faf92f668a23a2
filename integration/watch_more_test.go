package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
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

// TestWatch_NoticeWithoutSignalProcess: spotagent run --watch, no
// --notice-signal, a trainer that rotates its checkpoints every 700 ms
// (save_total_limit=1), a spot notice from the fake AWS metadata server
// with a 15 s deadline. The agent commits while the trainer rotates, keeps
// it running after the notice and commits each newer checkpoint, stops it
// at the upload deadline and exits 75; the interruption leaves a checkpoint
// written well after the notice, and few steps lost.
func TestWatch_NoticeWithoutSignalProcess(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	out := filepath.Join(dir, "out") // created by the agent
	fk := startFake(t, "aws")
	a := start(t, []string{"AWS_EC2_METADATA_DISABLED=true"}, append(watchArgs(dir, out, store, cloudArgs(t, "aws", fk.URL())...), rotatingTrainer(out, "0.7")...)...)
	a.waitLines(`checkpoint committed`, 2, time.Minute) // rotation does not stop commits
	a.waitLine(`saved step`, time.Minute)
	saved := regexp.MustCompile(`saved step (\d+)`).FindAllStringSubmatch(a.output(), -1)
	atNotice := atoi(t, saved[len(saved)-1][1])
	fk.(*fake.AWS).Terminate("terminate", time.Now().Add(15*time.Second))
	if code := a.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	st := openTestStore(t, store, all.Options{})
	in := oneInterruption(t, noticeJournal(t, st))
	if !in.CommitOK {
		t.Fatalf("interruption %+v: not committed", in)
	}
	// 15 s notice, a save every 0.7 s: the trainer ran several seconds
	// past the notice, and its checkpoints were committed as they came.
	if in.Step < int64(atNotice)+50 {
		t.Fatalf("the interruption left step %d; the trainer was at %d at the notice: it was stopped too early", in.Step, atNotice)
	}
	if in.LostSteps > 30 {
		t.Fatalf("lost %d steps (%+v), want at most the steps since the last save that could still be uploaded", in.LostSteps, in)
	}
	l := readLatestPointer(t, st)
	if l.Step != in.Step {
		t.Fatalf("latest step %d, interruption step %d", l.Step, in.Step)
	}
	t.Logf("notice at step %d; committed %d; lost %d steps, %.1f s", atNotice, in.Step, in.LostSteps, in.LostSeconds)
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
