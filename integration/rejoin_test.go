package integration

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestSidecar_TrainerBackAfterCommitResumesIt: in a pod the trainer
// container gets SIGTERM before its native sidecar; with
// SPOTAGENT_HANDLE_SIGTERM=1 the client turns it into a final checkpoint
// and exits 75 once the sidecar committed it (this half was
// TestSidecar_TrainerSigterm until #49). `spotagent sidecar` runs
// on while the trainer container is restarted in place. The sidecar
// started with nothing to restore; the new trainer process, a real Python
// trainer with the client, resumes from the step committed, restored from
// the sidecar's local tier into its restore area, not from scratch.
func TestSidecar_TrainerBackAfterCommitResumesIt(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "agent.sock")
	store := filepath.Join(dir, "store")
	agent := start(t, nil, "sidecar", "--store", "file://"+store, "--run-id", "pod",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", sock, "--interval", "1h", "--cloud", "none")
	agent.waitLine(`socket listening`, time.Minute)
	env := []string{"SPOTAGENT_SOCKET=" + sock, "SPOTAGENT_HANDLE_SIGTERM=1"}
	tr := trainerProc(t, env, "--steps", "2000", "--step-time", "0.01")
	tr.waitLine(`^step 50 `, time.Minute)
	if err := tr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	step := atoi(t, tr.waitLine(`checkpoint \S* ?\(shutdown\) at step (\d+)`, time.Minute)[1])
	tr.waitLine(`stopping at step`, time.Minute)
	if code := tr.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("trainer exit code %d, want %d", code, exitInterrupted)
	}
	st, err := file.New(store)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := checkpoint.ReadLatest(context.Background(), st); err != nil || int(l.Step) != step {
		t.Fatalf("latest=%+v err=%v, want step %d committed", l, err, step)
	}
	// The container restarts in place: same sidecar, new trainer process.
	tr2 := trainerProc(t, env, "--steps", "400", "--step-time", "0.001")
	r := tr2.waitLine(`resuming from step (\d+) \((.*)\)`, time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("the restarted trainer resumed from step %d, want %d (the committed one)", got, step)
	}
	if rel, err := filepath.Rel(filepath.Join(dir, "ckpt"), r[2]); err != nil || filepath.Base(filepath.Dir(r[2])) != "restore" {
		t.Fatalf("resume dir %s (%s, %v) is not in the sidecar's restore area", r[2], rel, err)
	}
	if code := tr2.wait(time.Minute); code != 0 {
		t.Fatalf("restarted trainer exit code %d\n%s", code, tr2.output())
	}
	agent.waitLine(`a trainer is back after a commit`, time.Minute)
	agent.signal(syscall.SIGTERM)
	if code := agent.wait(time.Minute); code != 0 {
		t.Fatalf("sidecar exit code %d", code)
	}
}

// TestNodeMode_AllowUIDRankBackAfterCommitReadsIt: `spotagent node
// --allow-uid 65534` as root, trainers as nobody. Rank 0 commits step 7;
// a second rank that says hello to the live run afterwards (protocol 1)
// is welcomed with step 7, restored then and handed to its uid: it reads
// the files and the manifest copy. Rank 0 comes back (protocol 2) while
// that rank is connected: the same checkpoint, at once.
func TestNodeMode_AllowUIDRankBackAfterCommitReadsIt(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs the trainer as uid %d and must run as root (uid %d), as CI does", nobody, os.Geteuid())
	}
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(dir, "runs")
	sock := filepath.Join(dir, "node.sock")
	p := start(t, nil, "node", "--store-prefix", "file://"+prefix, "--checkpoint-root", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1s", "--log-format", "json")
	p.waitEntry("socket listening", time.Minute, nil)

	tr := startPuppet(t)
	tr.must(map[string]any{"op": "connect", "path": sock})
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 1, "run_id": "podrun"}})
	if w := tr.recv("", "welcome"); w["resume"] != nil {
		t.Fatalf("first welcome resumes %v", w["resume"])
	}
	req := tr.recv("", "checkpoint")
	id, d := req["id"].(string), req["dir"].(string)
	tr.must(map[string]any{"op": "write", "path": filepath.Join(d, "model.pt"), "data": "weights at 7"})
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "done", "id": id, "step": 7}})
	if m := tr.recv(id, "committed", "upload_failed"); m["type"] != "committed" {
		t.Fatalf("checkpoint %s: %v, want committed", id, m)
	}

	tr2 := startPuppet(t)
	tr2.must(map[string]any{"op": "connect", "path": sock})
	tr2.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 2, "run_id": "podrun"}})
	rdir, _ := resumedAs(t, tr2, tr2.recv("", "welcome"))

	tr.close()
	tr3 := startPuppet(t)
	tr3.must(map[string]any{"op": "connect", "path": sock})
	tr3.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 3, "run_id": "podrun", "version": 2}})
	w := tr3.recv("", "welcome")
	if w["restore"] == "pending" {
		t.Fatalf("rank 0 back while its group's other rank is connected is told pending: %v; want the group's checkpoint at once", w)
	}
	if d, _ := resumedAs(t, tr3, w); d != rdir {
		t.Fatalf("rank 0 back resumes from %s, want %s (its group's)", d, rdir)
	}
	tr3.close()
	tr2.close()
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d", code)
	}
}
