package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
	requirePython(t, false)
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs the trainer as uid %d and must run as root (uid %d), as CI does", nobody, os.Geteuid())
	}
	const third = 65533
	dir := shortTemp(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(dir, "runs")
	ckptRoot := filepath.Join(dir, "ckpt")
	sock := filepath.Join(dir, "node.sock")
	p := start(t, nil, "node", "--store-prefix", "file://"+prefix, "--checkpoint-root", ckptRoot,
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1s", "--log-format", "json")
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
