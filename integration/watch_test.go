package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

const hfTrainer = "python/examples/train_hf_layout.py"

// hfReference runs the example bare (no agent) and returns its digests.
func hfReference(t *testing.T, steps string) string {
	t.Helper()
	dir := testutil.ShortDir(t)
	ref := filepath.Join(dir, "ref.json")
	cmd := exec.Command(python, hfTrainer, "--output-dir", filepath.Join(dir, "out"), "--steps", steps,
		"--save-steps", "40", "--step-time", "0", "--out", ref)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("reference run: %v\n%s", err, out)
	}
	return ref
}

// watchArgs: spotagent run --watch out, with its own scratch dir and socket.
func watchArgs(dir, out, store string, extra ...string) []string {
	// --cloud none unless extra names a fake (the last --cloud wins).
	args := []string{"run", "--store", store, "--run-id", "it", "--cloud", "none", "--watch", out, "--watch-quiet", "500ms",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--poll-interval", "100ms", "--log-level", "info"}
	return append(args, extra...)
}

func mkdir(t *testing.T, p string) string {
	t.Helper()
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWatch_NoticeAndResume: a trainer with no spotagent import, saving
// checkpoint-<step>/ like Hugging Face's Trainer, under spotagent run
// --watch. A spot notice (fake AWS) makes the agent signal it; it saves and
// exits; the agent commits that checkpoint and exits 75. A new machine with
// an empty output directory gets it back under its name, the trainer
// resumes from it, and its final weights are bit-identical to a run
// without interruption.
func TestWatch_NoticeAndResume(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	ref := hfReference(t, "200")
	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	trainer := func(out string) []string {
		return []string{"--", python, hfTrainer, "--output-dir", out, "--steps", "200", "--save-steps", "40",
			"--step-time", "0.05", "--save-on-signal", "--out", filepath.Join(dir, "final.json")}
	}

	fk := startFake(t, "aws")
	out1 := mkdir(t, filepath.Join(dir, "m1", "out"))
	first := start(t, nil, append(watchArgs(filepath.Join(dir, "m1"), out1, store, append(cloudArgs(t, "aws", fk.URL()),
		"--notice-signal", "SIGTERM")...), trainer(out1)...)...)
	first.waitLine(`starting fresh`, 2*time.Minute)
	first.waitLine(`checkpoint committed.*"step": 40`, time.Minute)
	fk.(*fake.AWS).Terminate("terminate", time.Now().Add(60*time.Second))
	m := first.waitLine(`saved \S+/checkpoint-(\d+) on SIGTERM`, time.Minute)
	step := atoi(t, m[1])
	first.waitLine(`interruption checkpoint committed`, time.Minute)
	if code := first.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
	}
	if _, err := os.Stat(filepath.Join(dir, "final.json")); err == nil {
		t.Fatal("the interrupted run finished training: the notice came too late to test anything")
	}
	st := openTestStore(t, store, all.Options{})
	in := oneInterruption(t, noticeJournal(t, st))
	committedBeforeDeadline(t, in)
	if in.Step != int64(step) {
		t.Fatalf("journal: the interruption left step %d, want %d (what the trainer saved)", in.Step, step)
	}
	l := readLatestPointer(t, st)
	if l.Step != int64(step) || l.ID != in.CheckpointID {
		t.Fatalf("latest=%+v, want step %d id %s", l, step, in.CheckpointID)
	}
	man, err := checkpoint.ReadManifest(t.Context(), st, l.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ Watch struct{ Name, Kind string } }
	if err := json.Unmarshal(man.Metadata, &meta); err != nil || meta.Watch.Name != "checkpoint-"+m[1] || meta.Watch.Kind != "dir" {
		t.Fatalf("manifest metadata %s does not record the original name checkpoint-%s (%v)", man.Metadata, m[1], err)
	}
	var paths []string
	for _, f := range man.Files {
		paths = append(paths, f.Path)
	}
	if got, want := strings.Join(paths, ","), "optimizer.pt,pytorch_model.bin,rng_state.pth,scheduler.pt,trainer_state.json"; got != want {
		t.Fatalf("committed files %s, want %s", got, want)
	}

	// A new machine: empty local disk, no notice.
	fk2 := startFake(t, "aws")
	out2 := mkdir(t, filepath.Join(dir, "m2", "out"))
	second := start(t, nil, append(watchArgs(filepath.Join(dir, "m2"), out2, store, cloudArgs(t, "aws", fk2.URL())...), trainer(out2)...)...)
	r := second.waitLine(`resuming from step (\d+) .*checkpoint-(\d+)`, 2*time.Minute)
	if atoi(t, r[1]) != step || atoi(t, r[2]) != step {
		t.Fatalf("resumed from %v, want step %d from checkpoint-%d", r, step, step)
	}
	if code := second.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	sameFile(t, filepath.Join(dir, "final.json"), ref)
	j := noticeJournal(t, st)
	if len(j.Restores) != 1 || j.Restores[0].Step != int64(step) {
		t.Fatalf("journal restores=%+v, want one at step %d", j.Restores, step)
	}
	// The run's last checkpoint was committed before the agent ended.
	if l := readLatestPointer(t, st); l.Step != 200 {
		t.Fatalf("latest step %d after the run finished, want 200", l.Step)
	}
}

// TestWatch_TornNeverCommitted: the trainer is killed (SIGKILL) half-way
// through writing checkpoint-80. That directory is never committed and
// never restored: the restart (--max-restarts) moves it aside and the
// trainer resumes from checkpoint-40, ending bit-identical to a run
// without the crash.
func TestWatch_TornNeverCommitted(t *testing.T) {
	parallelTorch(t)
	requirePython(t, true)
	ref := hfReference(t, "120")
	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	out := mkdir(t, filepath.Join(dir, "out"))
	// The crash comes once only: a marker file makes the restarted trainer skip it.
	wrapper := filepath.Join(dir, "train.sh")
	script := "#!/bin/sh\nif [ -e " + dir + "/died ]; then exec " + python + " " + hfTrainer + " \"$@\"; fi\ntouch " + dir + "/died\nexec " +
		python + " " + hfTrainer + " --die-while-saving-at 80 \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, append(watchArgs(dir, out, store, "--max-restarts", "1"), "--", wrapper, "--output-dir", out,
		"--steps", "120", "--save-steps", "40", "--step-time", "0.05", "--out", filepath.Join(dir, "final.json"))...)
	p.waitLine(`dying while saving`, 2*time.Minute)
	p.waitLine(`moved a local checkpoint aside.*checkpoint-80`, time.Minute)
	p.waitLine(`resuming from step 40 `, time.Minute)
	if code := p.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	sameFile(t, filepath.Join(dir, "final.json"), ref)
	st := openTestStore(t, store, all.Options{})
	entries, err := checkpoint.ListManifests(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Manifest == nil || e.Manifest.Step != 80 {
			continue
		}
		// The re-run wrote checkpoint-80 completely; the torn one had 2 files.
		if len(e.Manifest.Files) != 5 {
			t.Fatalf("a torn checkpoint-80 was committed: %+v", e.Manifest.Files)
		}
	}
	j := noticeJournal(t, st)
	if len(j.Restores) != 1 || j.Restores[0].Step != 40 {
		t.Fatalf("journal restores=%+v, want one of step 40", j.Restores)
	}
}
