package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

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
