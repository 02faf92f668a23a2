package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// TestNodeMode_AllowUIDTrainerCheckpoints: `spotagent node --allow-uid
// 65534`, running as root, and a trainer running as nobody (a pod that is
// not root). The directory a checkpoint request hands the trainer is
// nobody's, 0700, reachable through the agent's directories (search bit
// only): the trainer saves into it and the checkpoint commits. A third
// uid can neither write in it nor list the agent's directories above it.
// (Was: the request directory and every level above it were root's, 0700:
// the trainer got "Permission denied" and could never checkpoint.)
func TestNodeMode_AllowUIDTrainerCheckpoints(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs the trainer as uid %d and must run as root (uid %d), as CI does", nobody, os.Geteuid())
	}
	const third = 65533
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(dir, "runs")
	ckptRoot := filepath.Join(dir, "ckpt")
	sock := filepath.Join(dir, "node.sock")
	args := []string{"node", "--store-prefix", "file://" + prefix, "--checkpoint-root", ckptRoot,
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1s", "--log-format", "json"}
	p := start(t, nil, args...)
	p.waitEntry("socket listening", time.Minute, nil)

	tr := startPuppet(t)
	tr.must(map[string]any{"op": "connect", "path": sock})
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 1, "run_id": "podrun"}})
	tr.recv("", "welcome")

	req := tr.recv("", "checkpoint")
	id, d := req["id"].(string), req["dir"].(string)
	fi, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || fi.Mode().Perm() != 0o700 {
		t.Fatalf("request directory %s: owner uid %d mode %v, want uid %d and 0700", d, st.Uid, fi.Mode(), nobody)
	}
	// A third uid cannot write there, nor list the directories above it.
	if out := asUID(t, third, `
import os, sys
for f in (lambda: open(os.path.join(sys.argv[1], "evil"), "wb"), lambda: os.listdir(sys.argv[2])):
    try:
        f()
        print("allowed")
    except PermissionError:
        print("denied")
`, d, filepath.Dir(d)); out != "denied\ndenied" {
		t.Fatalf("uid %d writing %s, then listing its parent: %q, want denied twice", third, d, out)
	}
	tr.must(map[string]any{"op": "write", "path": filepath.Join(d, "model.pt"), "data": "weights at 7"})
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "done", "id": id, "step": 7}})
	if m := tr.recv(id, "committed", "upload_failed"); m["type"] != "committed" {
		t.Fatalf("checkpoint %s saved by uid %d: %v, want committed", id, nobody, m)
	}
	if step, _ := storeLatest(t, filepath.Join(prefix, "podrun")); step != 7 {
		t.Fatalf("latest step %d in the store, want 7", step)
	}
	tr.close()
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d", code)
	}

	// The node agent starts again: the run's trainer, still uid 65534,
	// reads the checkpoint it is told to resume from; a third uid can
	// neither read nor list it, and the local tier's copy stays as it was.
	p = start(t, nil, args...)
	p.waitEntry("socket listening", time.Minute, nil)
	tr = startPuppet(t)
	tr.must(map[string]any{"op": "connect", "path": sock})
	// Protocol 2: told "pending", then "restored" (unless the restore
	// ended before the hello: then the welcome has the resume).
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 1, "run_id": "podrun", "version": 2}})
	w := tr.recv("", "welcome")
	if w["restore"] == "pending" {
		w = tr.recv("", "restored", "restore_failed")
	}
	rdir, manifest := resumedAs(t, tr, w)
	checkRestoreReadOnly(t, ckptRoot, rdir, manifest)
	// A second rank of the same uid, protocol 1, after the restore: its
	// welcome carries the resume, and it reads it too.
	tr2 := startPuppet(t)
	tr2.must(map[string]any{"op": "connect", "path": sock})
	tr2.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 2, "run_id": "podrun"}})
	if d, _ := resumedAs(t, tr2, tr2.recv("", "welcome")); d != rdir {
		t.Fatalf("second rank resumes from %s, want %s", d, rdir)
	}
	tr2.close()
	tr.close()
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d after the restart", code)
	}
}

// checkRestoreReadOnly: the trainer's uid (nobody) can change nothing of
// the restored checkpoint rdir (write, chmod, or open the local tier's
// copy of it, below ckptRoot's run podrun), a third uid can neither read
// nor list it nor read the manifest copy, and the local tier's copy is
// another file than the restored one, its content unchanged.
func checkRestoreReadOnly(t *testing.T, ckptRoot, rdir, manifest string) {
	t.Helper()
	const third = 65533
	model := filepath.Join(rdir, "model.pt")
	tier, _ := filepath.Glob(filepath.Join(ckptRoot, "podrun", "spotagent-podrun", "committed", "*", "model.pt"))
	if len(tier) != 1 {
		t.Fatalf("local tier copies of model.pt: %v, want one", tier)
	}
	if out := asUID(t, nobody, `
import os, sys
def tries(*fs):
    for f in fs:
        try:
            f()
            print("allowed")
        except PermissionError:
            print("denied")
tries(lambda: open(sys.argv[1], "ab"), lambda: os.chmod(sys.argv[1], 0o644),
      lambda: open(os.path.join(sys.argv[2], "evil"), "wb"), lambda: open(sys.argv[3], "ab"))
`, model, rdir, tier[0]); out != "denied\ndenied\ndenied\ndenied" {
		t.Fatalf("uid %d appending to, chmodding, adding to its restored checkpoint, appending to the local tier's copy: %q, want denied four times", nobody, out)
	}
	if out := asUID(t, third, `
import os, sys
for f in (lambda: open(sys.argv[1], "rb").read(), lambda: os.listdir(sys.argv[2]), lambda: open(sys.argv[3], "rb").read()):
    try:
        f()
        print("allowed")
    except PermissionError:
        print("denied")
`, model, rdir, manifest); out != "denied\ndenied\ndenied" {
		t.Fatalf("uid %d reading, listing the restored checkpoint, reading its manifest: %q, want denied three times", third, out)
	}
	if got := string(readFile(t, tier[0])); got != "weights at 7" {
		t.Fatalf("local tier's copy: %q, want %q", got, "weights at 7")
	}
	a, errA := os.Stat(model)
	b, errB := os.Stat(tier[0])
	if errA != nil || errB != nil || os.SameFile(a, b) {
		t.Fatalf("the restored file and the local tier's copy are one file (hard link) or unreadable: %v %v", errA, errB)
	}
	if st := a.Sys().(*syscall.Stat_t); st.Uid != 0 || a.Mode().Perm() != 0o444 || st.Nlink != 1 {
		t.Fatalf("restored file: owner uid %d mode %v links %d, want root's, 0444, one link", st.Uid, a.Mode(), st.Nlink)
	}
}

// asUID runs python code as uid (and gid) uid and returns its output,
// trimmed; a failure fails the test.
func asUID(t *testing.T, uid int, code string, args ...string) string {
	t.Helper()
	cmd := exec.Command(python, append([]string{"-c", code}, args...)...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python as uid %d: %v\n%s", uid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// puppetRead is what the puppet trainer reads at path (a failure fails
// the test).
func puppetRead(t *testing.T, p *puppet, path string) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(p.must(map[string]any{"op": "read", "path": path}), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// resumedAs checks that m (a welcome or restored) resumes from step 7 and
// that trainer p (uid nobody) reads the checkpoint's file and the
// manifest copy; it returns their paths.
func resumedAs(t *testing.T, p *puppet, m map[string]any) (dir, manifest string) {
	t.Helper()
	resume, _ := m["resume"].(map[string]any)
	if resume == nil || resume["step"] != float64(7) {
		t.Fatalf("%v after the restart: resume %v, want step 7", m["type"], resume)
	}
	dir, manifest = resume["dir"].(string), resume["manifest"].(string)
	if got := puppetRead(t, p, filepath.Join(dir, "model.pt")); got != "weights at 7" {
		t.Fatalf("uid %d reading its resumed checkpoint: %q, want %q", nobody, got, "weights at 7")
	}
	if got := puppetRead(t, p, manifest); !strings.Contains(got, `"step": 7`) {
		t.Fatalf("uid %d reading the resume's manifest: %q, want step 7", nobody, got)
	}
	return dir, manifest
}
