package integration

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// TestRun_RestoreFromLocal (#38 items 1 and 3): a real trainer under
// `spotagent run` against S3 gets SIGTERM part-way, checkpoints and stops;
// the second run on the same machine restores that checkpoint from the
// local tier, reading no data byte from the store (every request is
// counted at a proxy in front of it), says so in its start-up log, the
// journal and `history`, and ends with exactly the parameters of an
// uninterrupted run.
func TestRun_RestoreFromLocal(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	fs := newFaultStores(t, "s3", "local")
	reads := fs.recordDataReads("/manifest.json")
	dir := testutil.ShortDir(t)
	env := append(fs.env, "AWS_EC2_METADATA_DISABLED=true")
	trainer := []string{"--", python, "python/examples/train.py", "--steps", "1000", "--step-time", "0.01"}

	ref := start(t, nil, append(agentArgs(filepath.Join(dir, "ref"), "file://"+filepath.Join(dir, "refstore")),
		append(noSleep(trainer), "--out", filepath.Join(dir, "ref.json"))...)...)
	if code := ref.wait(2 * time.Minute); code != 0 {
		t.Fatalf("reference run exit code %d", code)
	}

	run1 := start(t, env, append(agentArgs(dir, fs.uri), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	run1.waitLine(`starting fresh`, time.Minute)
	run1.waitLine(`^step 50 `, time.Minute)
	run1.signal(syscall.SIGTERM)
	step := atoi(t, run1.waitLine(`checkpoint \S+ \(shutdown\) at step (\d+)`, time.Minute)[1])
	run1.waitLine(`kept a local copy of the committed checkpoint`, time.Minute)
	if code := run1.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
	}

	reads.start()
	run2 := start(t, env, append(agentArgs(dir, fs.uri), append(trainer, "--out", filepath.Join(dir, "out.json"))...)...)
	run2.waitLine(`restored checkpoint.*"from": "local".*"store_bytes": 0`, time.Minute)
	if got := atoi(t, run2.waitLine(`resuming from step (\d+)`, time.Minute)[1]); got != step {
		t.Fatalf("resumed from step %d, want %d", got, step)
	}
	if code := run2.wait(2 * time.Minute); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	if got := reads.read(); len(got) != 0 {
		t.Fatalf("the restore read %d data objects from the store, want 0: %v", len(got), got)
	}
	sameFile(t, filepath.Join(dir, "out.json"), filepath.Join(dir, "ref.json"))

	j, err := journal.Read(t.Context(), fs.direct, "it")
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Restores) != 1 || j.Restores[0].Sources() != "local" || j.Restores[0].From["local"] != j.Restores[0].Bytes {
		b, _ := json.Marshal(j.Restores)
		t.Fatalf("journal restores %s: want one, all from local", b)
	}
	if out := runSpotagentTool(t, env, "history", "--store", fs.uri); !strings.Contains(out, " local ") {
		t.Fatalf("history does not say the restore came from local:\n%s", out)
	}
}
