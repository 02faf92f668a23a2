package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// A trainer running as another uid (nobody, 65534) beside an agent
// running as root (this process: `spotagent sidecar` and `node
// --allow-uid`, in-process): what the trainer may and may not make the
// agent read, where its checkpoints go, and what it can do to a restore.
// The trainer is a real Python process as uid 65534, the puppet, which the
// test drives step by step. (End to end until #49: the agent's uid is
// root either way; the trainer's is the puppet's, a process of its own.)

// puppetTrainer is a trainer speaking protocol v1 over a raw socket, driven
// line by line from its stdin (JSON commands), so that a test decides each
// step and waits for its result ("ok <json>" or "err <text>") instead of
// sleeping. Messages a recv skips are kept for a later recv.
const puppetTrainer = `
import json, os, socket, sys
sock = rf = None
kept = []
def out(kind, v):
    sys.stdout.write(kind + " " + json.dumps(v) + "\n")
    sys.stdout.flush()
def match(m, c):
    return m.get("type") in c["types"] and c.get("id") in (None, m.get("id"))
for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    try:
        if op == "connect":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(60)
            sock.connect(c["path"])
            rf = sock.makefile("rb")
            out("ok", None)
        elif op == "send":
            sock.sendall((json.dumps(c["msg"]) + "\n").encode())
            out("ok", None)
        elif op == "recv":
            got = next((m for m in kept if match(m, c)), None)
            if got is not None:
                kept.remove(got)
            while got is None:
                raw = rf.readline()
                if not raw:
                    raise EOFError("agent closed the connection")
                m = json.loads(raw)
                if match(m, c):
                    got = m
                else:
                    kept.append(m)
            out("ok", got)
        elif op == "write":
            os.makedirs(os.path.dirname(c["path"]), exist_ok=True)
            with open(c["path"], "wb") as f:
                f.write(c["data"].encode())
                f.flush()
                os.fsync(f.fileno())
            out("ok", None)
        elif op == "link":
            os.link(c["src"], c["dst"])
            out("ok", None)
        elif op == "rename":
            os.rename(c["src"], c["dst"])
            out("ok", None)
        elif op == "symlink":
            os.symlink(c["src"], c["dst"])
            out("ok", None)
        elif op == "read":
            with open(c["path"], "rb") as f:
                out("ok", f.read().decode(errors="replace"))
        else:
            out("err", "unknown op " + op)
    except (OSError, EOFError) as e:
        out("err", "%s: %s" % (e.__class__.__name__, e))
`

// puppet is a running puppetTrainer.
type puppet struct {
	t     *testing.T
	in    io.Closer
	stdin *json.Encoder
	lines chan string
}

// puppetStart runs puppetTrainer as uid/gid nobody; it is killed when the
// test ends.
func puppetStart(t *testing.T) *puppet {
	t.Helper()
	cmd := exec.Command(testPython, "-c", puppetTrainer)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &puppet{t: t, in: in, stdin: json.NewEncoder(in), lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		for range p.lines { // its reader ends at the dead process's EOF
		}
		cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("trainer stderr:\n%s", stderr.String())
		}
	})
	return p
}

// close ends the trainer: its stdin closes, it exits.
func (p *puppet) close() {
	p.in.Close()
	for range p.lines {
	}
}

// do runs one command and returns its result: ok, and the JSON value (or
// the error text).
func (p *puppet) do(cmd map[string]any) (bool, json.RawMessage) {
	p.t.Helper()
	if err := p.stdin.Encode(cmd); err != nil {
		p.t.Fatalf("trainer: %v", err)
	}
	select {
	case l, open := <-p.lines:
		if !open {
			p.t.Fatalf("trainer exited during %v", cmd)
		}
		kind, v, _ := strings.Cut(l, " ")
		return kind == "ok", json.RawMessage(v)
	case <-time.After(90 * time.Second):
		p.t.Fatalf("trainer: no answer to %v", cmd)
	}
	return false, nil
}

// must runs cmd and fails the test unless it succeeds.
func (p *puppet) must(cmd map[string]any) json.RawMessage {
	p.t.Helper()
	ok, v := p.do(cmd)
	if !ok {
		p.t.Fatalf("trainer %v: %s", cmd, v)
	}
	return v
}

// recv waits for the agent's next message of one of types (for id, unless
// empty).
func (p *puppet) recv(id string, types ...string) map[string]any {
	p.t.Helper()
	c := map[string]any{"op": "recv", "types": types}
	if id != "" {
		c["id"] = id
	}
	var m map[string]any
	if err := json.Unmarshal(p.must(c), &m); err != nil {
		p.t.Fatal(err)
	}
	return m
}

// read is what the trainer reads at path (a failure fails the test).
func (p *puppet) read(path string) string {
	p.t.Helper()
	var s string
	if err := json.Unmarshal(p.must(map[string]any{"op": "read", "path": path}), &s); err != nil {
		p.t.Fatal(err)
	}
	return s
}

// puppetHardLink makes the trainer hard-link src (root's, mode 0600) to
// dst, as a trainer can where fs.protected_hardlinks=0. The sysctl is
// turned off for the link only, and put back at once. Where it cannot be
// written (a read-only /proc/sys), the test links as root on the trainer's
// behalf, which gives the agent the same file to refuse (a link shares
// the inode and its owner), and says so.
func puppetHardLink(t *testing.T, p *puppet, src, dst string) {
	t.Helper()
	const knob = "/proc/sys/fs/protected_hardlinks"
	old, err := os.ReadFile(knob)
	if err == nil && strings.TrimSpace(string(old)) != "0" {
		if err = os.WriteFile(knob, []byte("0"), 0); err == nil {
			defer func() {
				if err := os.WriteFile(knob, old, 0); err != nil {
					t.Errorf("could not restore %s to %s: %v", knob, strings.TrimSpace(string(old)), err)
				}
			}()
		}
	}
	if err != nil {
		t.Logf("cannot turn %s off (%v): linking %s as root on the trainer's behalf", knob, err, dst)
		if err := os.Link(src, dst); err != nil {
			t.Fatal(err)
		}
		return
	}
	p.must(map[string]any{"op": "link", "src": src, "dst": dst})
}

// uidRootSecret is a root-only (0600) file with a random body in DIR/etc,
// on the checkpoint's filesystem (a hard link to it needs one): what a
// hostile trainer reaches for.
type uidRootSecret struct{ path, body string }

func uidNewRootSecret(t *testing.T, dir string) uidRootSecret {
	t.Helper()
	d := filepath.Join(dir, "etc")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	var b [16]byte
	rand.Read(b[:])
	s := uidRootSecret{path: filepath.Join(d, "shadow"), body: "ROOT-ONLY-" + hex.EncodeToString(b[:])}
	if err := os.WriteFile(s.path, []byte(s.body), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// notIn fails t for every regular file under store that holds the
// secret's bytes.
func (s uidRootSecret) notIn(t *testing.T, store string) {
	t.Helper()
	filepath.WalkDir(store, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a store write's temporary file, renamed since the listing
		}
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		if bytes.Contains(b, []byte(s.body)) {
			t.Errorf("the root-only file's bytes reached the store: %s", p)
		}
		return nil
	})
}

// uidSharedDir is a fresh short directory (sockets) that the trainer's
// uid can pass through (0755).
func uidSharedDir(t *testing.T) string {
	t.Helper()
	dir := shortTempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// uidStoreLatest is the step of <store>/latest.json of a file store.
func uidStoreLatest(t *testing.T, store string) int64 {
	t.Helper()
	var l struct {
		Step int64 `json:"step"`
	}
	b, err := os.ReadFile(filepath.Join(store, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("latest.json: %v", err)
	}
	return l.Step
}

// TestOwner_OtherUIDTrainer: a sidecar agent running as root, a trainer
// running as nobody (uid 65534) on its socket. The trainer's own files
// commit and restore; a hard link to a root-only (0600) file, or a symlink
// to it, is refused whether it is reported early (`saved`) or found at
// `done`: the checkpoint is not committed, the trainer is told why, and the
// file's bytes never reach the store.
//
// Requested checkpoints go into the agent's area: the agent hands each
// request's directory to the trainer's uid (0700) and lets it through the
// area (search bit only); the `done` cases use directories the trainer
// makes itself in a world-writable --checkpoint-dir, as on a Kubernetes
// emptyDir.
func TestOwner_OtherUIDTrainer(t *testing.T) {
	needRoot(t)
	dir := uidSharedDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	if err := os.Mkdir(ckpt, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ckpt, 0o1777); err != nil { // like an emptyDir
		t.Fatal(err)
	}
	sec := uidNewRootSecret(t, dir)
	secret := sec.path
	store := filepath.Join(dir, "store")
	sock := filepath.Join(dir, "agent.sock")
	agent := startStoppedAtEnd(t, "sidecar", "--store", "file://"+store, "--run-id", "own", "--checkpoint-dir", ckpt,
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1s",
		"--log-format", "json")
	agent.entryWithin(t, "socket listening", time.Minute, nil)

	tr := puppetStart(t)
	if ok, v := tr.do(map[string]any{"op": "read", "path": secret}); ok {
		t.Fatalf("the trainer can read the secret itself (%s): the test proves nothing", v)
	}
	tr.must(map[string]any{"op": "connect", "path": sock})
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 1}})
	tr.recv("", "welcome")

	// A checkpoint the trainer takes on its own, in a directory it made.
	own := func(step int, extra func(d string)) map[string]any {
		d := filepath.Join(ckpt, "own-"+strconv.Itoa(step))
		tr.must(map[string]any{"op": "write", "path": filepath.Join(d, "model.pt"), "data": "weights at " + strconv.Itoa(step)})
		if extra != nil {
			extra(d)
		}
		tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "done", "id": "", "step": step, "dir": d}})
		return tr.recv("", "committed", "upload_failed")
	}

	// (a) Its own files commit.
	if m := own(10, nil); m["type"] != "committed" {
		t.Fatalf("the trainer's own checkpoint: %v, want committed", m)
	}
	// (b) A hard link to the root-only file, found at done.
	m := own(20, func(d string) { puppetHardLink(t, tr, secret, filepath.Join(d, "x")) })
	if m["type"] != "upload_failed" || !strings.Contains(m["error"].(string), "owned by uid 0, not by the trainer") {
		t.Fatalf("a hard link to a root-only file at done: %v, want upload_failed (owned by uid 0)", m)
	}
	// (c) A symlink to it, found at done.
	m = own(30, func(d string) {
		tr.must(map[string]any{"op": "symlink", "src": secret, "dst": filepath.Join(d, "x")})
	})
	if m["type"] != "upload_failed" || !strings.Contains(m["error"].(string), "x: L--------- is not a regular file: refused") {
		t.Fatalf("a symlink to a root-only file at done: %v, want upload_failed (not a regular file)", m)
	}

	// The same, reported early with saved, in requested checkpoints.
	requested := func(step int, plant func(d string), want string) {
		t.Helper()
		req := tr.recv("", "checkpoint")
		id, d := req["id"].(string), req["dir"].(string)
		tr.must(map[string]any{"op": "write", "path": filepath.Join(d, "model.pt"), "data": "weights at " + strconv.Itoa(step)})
		tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "saved", "id": id, "path": "model.pt", "step": step}})
		plant(d)
		tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "saved", "id": id, "path": "x", "step": step}})
		e := tr.recv(id, "error")
		if msg := e["error"].(string); !strings.HasPrefix(msg, `saved "x"`) || !strings.Contains(msg, want) {
			t.Fatalf("saved x: %q, want an error about x saying %q", msg, want)
		}
		tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "done", "id": id, "step": step}})
		if m := tr.recv(id, "committed", "upload_failed"); m["type"] != "upload_failed" {
			t.Fatalf("checkpoint %s with x: %v, want upload_failed", id, m)
		}
	}
	// (b) A hard link to the root-only file, reported saved.
	requested(40, func(d string) { puppetHardLink(t, tr, secret, filepath.Join(d, "x")) },
		"owned by uid 0, not by the trainer (uid [65534]): not the trainer's own file: refused: this checkpoint will not be committed")
	e := agent.entryWithin(t, "saved refused: not the trainer's own file: the checkpoint will not be committed", 10*time.Second, nil)
	if e["path"] != "x" || e["peer_uid"] != float64(nobody) {
		t.Fatalf("refusal logged path %v peer_uid %v, want x and %d", e["path"], e["peer_uid"], nobody)
	}
	// (c) A symlink to it, reported saved: never opened (it leads out).
	requested(50, func(d string) {
		tr.must(map[string]any{"op": "symlink", "src": secret, "dst": filepath.Join(d, "x")})
	}, "path escapes from parent")

	// Only the trainer's own checkpoint stands, and restores.
	if step := uidStoreLatest(t, store); step != 10 {
		t.Fatalf("latest step %d, want 10 (the refused checkpoints must not commit)", step)
	}
	sec.notIn(t, store)
	dest := filepath.Join(dir, "restored")
	if code, out, errOut := cli(t, "restore", "--store", "file://"+store, "--dest", dest); code != 0 {
		t.Fatalf("restore: exit code %d\n%s%s", code, out, errOut)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "model.pt")); err != nil || string(got) != "weights at 10" {
		t.Fatalf("restored model.pt %q (%v), want the trainer's step 10", got, err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "x")); err == nil {
		t.Fatal("the restore holds x")
	}
	// The trainer leaves (a request it did not answer is abandoned), then
	// the kubelet's SIGTERM.
	tr.close()
	testutil.WaitWithin(t, "the trainer's connection closed", 30*time.Second, func() bool {
		return len(agent.entries("connection closed", nil))+len(agent.entries("connection closed by peer", nil)) > 0
	})
	sigtermSelf(t)
	if code := agent.waitWithin(t, time.Minute); code != 0 {
		t.Fatalf("sidecar exit code %d:\n%s", code, agent.stderr.String())
	}
}

// TestOwner_SidecarWatchOtherUID: spotagent sidecar --watch DIR, running
// as root, beside a trainer running as nobody that made DIR (no socket:
// the trainer's uid is DIR's owner). Its own checkpoints commit; one that
// holds a hard link to a root-only file is refused with a warning and never
// reaches the store, and the next one commits all the same.
func TestOwner_SidecarWatchOtherUID(t *testing.T) {
	needRoot(t)
	dir := uidSharedDir(t)
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(out, nobody, nobody); err != nil { // the trainer made it
		t.Fatal(err)
	}
	sec := uidNewRootSecret(t, dir)
	secret := sec.path
	store := filepath.Join(dir, "store")
	sc := startStoppedAtEnd(t, "sidecar", "--store", "file://"+store, "--run-id", "it", "--cloud", "none", "--watch", out, "--watch-quiet", "500ms",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--poll-interval", "100ms", "--log-level", "info", "--watch-marker", "none", "--log-format", "json")
	sc.entryWithin(t, "zero-code mode: watching the trainer's checkpoints", time.Minute, nil)

	tr := puppetStart(t)
	// Each checkpoint is written under another name and renamed into
	// place whole, so that it is never seen half-made.
	save := func(step int, extra func(d string)) {
		tmp := filepath.Join(out, "tmp-"+strconv.Itoa(step))
		tr.must(map[string]any{"op": "write", "path": filepath.Join(tmp, "model.bin"), "data": "weights at " + strconv.Itoa(step)})
		if extra != nil {
			extra(tmp)
		}
		tr.must(map[string]any{"op": "rename", "src": tmp, "dst": filepath.Join(out, "checkpoint-"+strconv.Itoa(step))})
	}
	committed := func(step int) {
		t.Helper()
		sc.entryWithin(t, "checkpoint committed", time.Minute, func(e map[string]any) bool { return e["step"] == float64(step) })
	}
	save(1, nil)
	committed(1)
	save(2, func(d string) { puppetHardLink(t, tr, secret, filepath.Join(d, "x")) })
	sc.entryWithin(t, "watched checkpoint not usable", time.Minute, func(e map[string]any) bool {
		why, _ := e["why"].(string)
		return e["name"] == "checkpoint-2" && strings.Contains(why, "checkpoint-2/x is owned by uid 0, not by the trainer (uid 65534")
	})
	save(3, nil)
	committed(3)
	sigtermSelf(t)
	if code := sc.waitWithin(t, time.Minute); code != 0 && code != 75 {
		t.Fatalf("sidecar exit code %d:\n%s", code, sc.stderr.String())
	}
	if step := uidStoreLatest(t, store); step != 3 {
		t.Fatalf("latest step %d, want 3", step)
	}
	sec.notIn(t, store)
	filepath.WalkDir(store, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "000000000002-") {
			t.Errorf("checkpoint-2 reached the store: %s", p)
		}
		return nil
	})
}

// uidNodeArgs is `spotagent node --allow-uid 65534` on a file store prefix
// and checkpoint root below dir, its socket open to all.
func uidNodeArgs(dir, ckptRoot, sock string) []string {
	return []string{"node", "--store-prefix", "file://" + filepath.Join(dir, "runs"), "--checkpoint-root", ckptRoot,
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1s", "--log-format", "json"}
}

// TestNodeMode_AllowUIDTrainerCheckpoints: `spotagent node --allow-uid
// 65534`, running as root, and a trainer running as nobody (a pod that is
// not root). The directory a checkpoint request hands the trainer is
// nobody's, 0700, reachable through the agent's directories (search bit
// only): the trainer saves into it and the checkpoint commits. A third
// uid can neither write in it nor list the agent's directories above it.
// (Was: the request directory and every level above it were root's, 0700:
// the trainer got "Permission denied" and could never checkpoint.)
func TestNodeMode_AllowUIDTrainerCheckpoints(t *testing.T) {
	needRoot(t)
	const third = 65533
	dir := uidSharedDir(t)
	ckptRoot := filepath.Join(dir, "ckpt")
	sock := filepath.Join(dir, "node.sock")
	args := uidNodeArgs(dir, ckptRoot, sock)
	p := startStoppedAtEnd(t, args...)
	p.entryWithin(t, "socket listening", time.Minute, nil)

	tr := puppetStart(t)
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
	if out := uidPython(t, third, `
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
	if step := uidStoreLatest(t, filepath.Join(dir, "runs", "podrun")); step != 7 {
		t.Fatalf("latest step %d in the store, want 7", step)
	}
	tr.close()
	sigtermSelf(t)
	if code := p.waitWithin(t, time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d:\n%s", code, p.stderr.String())
	}

	// The node agent starts again: the run's trainer, still uid 65534,
	// reads the checkpoint it is told to resume from; a third uid can
	// neither read nor list it, and the local tier's copy stays as it was.
	p = startStoppedAtEnd(t, args...)
	p.entryWithin(t, "socket listening", time.Minute, nil)
	tr = puppetStart(t)
	tr.must(map[string]any{"op": "connect", "path": sock})
	// Protocol 2: told "pending", then "restored" (unless the restore
	// ended before the hello: then the welcome has the resume).
	tr.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 1, "run_id": "podrun", "version": 2}})
	w := tr.recv("", "welcome")
	if w["restore"] == "pending" {
		w = tr.recv("", "restored", "restore_failed")
	}
	rdir, manifest := puppetResumedAs(t, tr, w)
	uidCheckRestoreReadOnly(t, ckptRoot, rdir, manifest)
	// A second rank of the same uid, protocol 1, after the restore: its
	// welcome carries the resume, and it reads it too.
	tr2 := puppetStart(t)
	tr2.must(map[string]any{"op": "connect", "path": sock})
	tr2.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 2, "run_id": "podrun"}})
	if d, _ := puppetResumedAs(t, tr2, tr2.recv("", "welcome")); d != rdir {
		t.Fatalf("second rank resumes from %s, want %s", d, rdir)
	}
	tr2.close()
	tr.close()
	sigtermSelf(t)
	if code := p.waitWithin(t, time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d after the restart:\n%s", code, p.stderr.String())
	}
}

// TestNodeMode_AllowUIDRankBackAfterCommitReadsIt: `spotagent node
// --allow-uid 65534` as root, trainers as nobody. Rank 0 commits step 7;
// a second rank that says hello to the live run afterwards (protocol 1)
// is welcomed with step 7, restored then and handed to its uid: it reads
// the files and the manifest copy. Rank 0 comes back (protocol 2) while
// that rank is connected: the same checkpoint, at once.
func TestNodeMode_AllowUIDRankBackAfterCommitReadsIt(t *testing.T) {
	needRoot(t)
	dir := uidSharedDir(t)
	sock := filepath.Join(dir, "node.sock")
	p := startStoppedAtEnd(t, uidNodeArgs(dir, filepath.Join(dir, "ckpt"), sock)...)
	p.entryWithin(t, "socket listening", time.Minute, nil)

	tr := puppetStart(t)
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

	tr2 := puppetStart(t)
	tr2.must(map[string]any{"op": "connect", "path": sock})
	tr2.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 2, "run_id": "podrun"}})
	rdir, _ := puppetResumedAs(t, tr2, tr2.recv("", "welcome"))

	tr.close()
	tr3 := puppetStart(t)
	tr3.must(map[string]any{"op": "connect", "path": sock})
	tr3.must(map[string]any{"op": "send", "msg": map[string]any{"type": "hello", "pid": 3, "run_id": "podrun", "version": 2}})
	w := tr3.recv("", "welcome")
	if w["restore"] == "pending" {
		t.Fatalf("rank 0 back while its group's other rank is connected is told pending: %v; want the group's checkpoint at once", w)
	}
	if d, _ := puppetResumedAs(t, tr3, w); d != rdir {
		t.Fatalf("rank 0 back resumes from %s, want %s (its group's)", d, rdir)
	}
	tr3.close()
	tr2.close()
	sigtermSelf(t)
	if code := p.waitWithin(t, time.Minute); code != 0 {
		t.Fatalf("node agent exit code %d:\n%s", code, p.stderr.String())
	}
}

// uidCheckRestoreReadOnly: the trainer's uid (nobody) can change nothing
// of the restored checkpoint rdir (write, chmod, or open the local tier's
// copy of it, below ckptRoot's run podrun), a third uid can neither read
// nor list it nor read the manifest copy, and the local tier's copy is
// another file than the restored one, its content unchanged.
func uidCheckRestoreReadOnly(t *testing.T, ckptRoot, rdir, manifest string) {
	t.Helper()
	const third = 65533
	model := filepath.Join(rdir, "model.pt")
	tier, _ := filepath.Glob(filepath.Join(ckptRoot, "podrun", "spotagent-podrun", "committed", "*", "model.pt"))
	if len(tier) != 1 {
		t.Fatalf("local tier copies of model.pt: %v, want one", tier)
	}
	if out := uidPython(t, nobody, `
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
	if out := uidPython(t, third, `
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
	if got, err := os.ReadFile(tier[0]); err != nil || string(got) != "weights at 7" {
		t.Fatalf("local tier's copy: %q (%v), want %q", got, err, "weights at 7")
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

// uidPython runs python code as uid (and gid) uid and returns its output,
// trimmed; a failure fails the test.
func uidPython(t *testing.T, uid int, code string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testPython, append([]string{"-c", code}, args...)...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python as uid %d: %v\n%s", uid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// puppetResumedAs checks that m (a welcome or restored) resumes from step
// 7 and that trainer p (uid nobody) reads the checkpoint's file and the
// manifest copy; it returns their paths.
func puppetResumedAs(t *testing.T, p *puppet, m map[string]any) (dir, manifest string) {
	t.Helper()
	resume, _ := m["resume"].(map[string]any)
	if resume == nil || resume["step"] != float64(7) {
		t.Fatalf("%v after the restart: resume %v, want step 7", m["type"], resume)
	}
	dir, manifest = resume["dir"].(string), resume["manifest"].(string)
	if got := p.read(filepath.Join(dir, "model.pt")); got != "weights at 7" {
		t.Fatalf("uid %d reading its resumed checkpoint: %q, want %q", nobody, got, "weights at 7")
	}
	if got := p.read(manifest); !strings.Contains(got, `"step": 7`) {
		t.Fatalf("uid %d reading the resume's manifest: %q, want step 7", nobody, got)
	}
	return dir, manifest
}
