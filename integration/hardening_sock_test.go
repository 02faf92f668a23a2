package integration

import (
	"net"
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

// Issue 13, items 1, 6 and 8: a hostile local user or pod against the
// agent's socket, on the real binary.

// sharedTemp is a short directory other uids may enter (0755), for a test
// that plays another uid: it must run as root, as CI does.
func sharedTemp(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test plays another uid and must run as root (uid %d), as CI does", os.Geteuid())
	}
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHardeningSock_ForeignDefaultDir: another user pre-creates the
// default socket directory, world-writable, to swap its own socket in.
// The agent refuses to start, says why, and runs no trainer. With
// XDG_RUNTIME_DIR set, the socket goes there instead.
func TestHardeningSock_ForeignDefaultDir(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := sharedTemp(t)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, os.ModeSticky|0o777); err != nil { // like /tmp
		t.Fatal(err)
	}
	sockDir := filepath.Join(tmp, "spotagent-"+strconv.Itoa(os.Geteuid()))
	asNobody(t, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", sockDir)

	args := []string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "victim",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--cloud", "none", "--interval", "1s", "--log-format", "json"}
	trainer := writeTrainer(t, dir, "good", 0)
	p := start(t, []string{"TMPDIR=" + tmp, "XDG_RUNTIME_DIR="}, append(args, trainer...)...)
	if code := p.wait(time.Minute); code == 0 {
		t.Fatal("spotagent started with another user's socket directory")
	}
	if !p.has(`socket dir ` + sockDir + ` is owned by uid 65534, not 0`) {
		t.Fatalf("no error naming the directory and its owner:\n%s", p.output())
	}
	if p.has(`^trainer:`) {
		t.Fatal("the trainer ran")
	}
	if ents, _ := os.ReadDir(sockDir); len(ents) != 0 {
		t.Fatalf("%d entries created in the foreign dir", len(ents))
	}
	fi, err := os.Lstat(sockDir)
	if err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("the foreign dir was changed: %v %v", fi.Mode(), err)
	}

	t.Run("XDGRuntimeDir", func(t *testing.T) {
		xdg := filepath.Join(dir, "xdg")
		if err := os.Mkdir(xdg, 0o700); err != nil {
			t.Fatal(err)
		}
		p := start(t, []string{"TMPDIR=" + tmp, "XDG_RUNTIME_DIR=" + xdg}, append(args, trainer...)...)
		l := p.waitEntry("socket listening", time.Minute, nil)
		if got, want := l.str("path"), filepath.Join(xdg, "spotagent", "victim.sock"); got != want {
			t.Fatalf("socket at %s, want %s", got, want)
		}
		fi, err := os.Lstat(filepath.Join(xdg, "spotagent"))
		if err != nil || fi.Mode() != os.ModeDir|0o700 {
			t.Fatalf("socket dir: %v %v, want drwx------", fi.Mode(), err)
		}
		p.waitEntry("checkpoint committed", time.Minute, nil)
		// spotagent status finds it the same way.
		out := runSpotagentTool(t, []string{"TMPDIR=" + tmp, "XDG_RUNTIME_DIR=" + xdg}, "status", "--run-id", "victim")
		if !strings.Contains(out, "victim") {
			t.Fatalf("status: %s", out)
		}
		p.signal(syscall.SIGTERM)
		if code := p.wait(time.Minute); code != exitInterrupted {
			t.Fatalf("exit code %d", code)
		}
	})
}

// TestHardeningSock_SocketReplaced: a configured socket in a directory
// every uid may write to (a Kubernetes emptyDir). The agent warns at start;
// when another user renames its own socket over the agent's, the agent
// notices, says so and binds its socket again.
func TestHardeningSock_SocketReplaced(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := sharedTemp(t)
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shared, "a.sock")
	p := start(t, nil, append(hostileArgs(dir, "--socket", sock), writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("checkpoint committed", time.Minute, nil)

	asNobody(t, `
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
tmp = sys.argv[1] + ".evil"
s.bind(tmp)
s.listen(1)
os.rename(tmp, sys.argv[1])
`, sock)
	testutil.WaitWithin(t, "the agent's socket back at its path", time.Minute, func() bool {
		fi, err := os.Lstat(sock)
		return err == nil && fi.Mode().Type() == os.ModeSocket && fi.Sys().(*syscall.Stat_t).Uid == 0
	})
	if st, _ := dialRaw(t, sock).status(10 * time.Second); st["run_id"] != "hostile" {
		t.Fatalf("status through the path: %v, want the agent's", st)
	}
	p.waitEntry("socket file replaced by a socket of uid 65534: re-created it; connections made meanwhile did not reach this agent", 10*time.Second, nil)
	w := p.waitEntry("socket dir: other users can replace the socket; trainers must check the agent's uid (the Python client does), and the agent re-creates its socket if it is replaced", time.Second, nil)
	if !strings.Contains(w.str("why"), "writable") {
		t.Fatalf("warning says %q, want writable", w.str("why"))
	}
	// The trainer's connection was never disturbed.
	p.waitCount("checkpoint committed", len(p.entries("checkpoint committed"))+1, time.Minute)
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d", code)
	}
}

// TestHardeningSock_SilentConnections: the repro scaled down: 200
// connections that never say a word, against an agent limited to 64 open
// files. The connection cap (a quarter of the limit) keeps fds for the
// commits, which go on committing.
func TestHardeningSock_SilentConnections(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "a.sock")
	args := append(hostileArgs(dir), writeTrainer(t, dir, "good", 0)...)
	cmd := exec.Command("sh", append([]string{"-c", `ulimit -n 64 && exec "$0" "$@"`, agentBin(t)}, args...)...)
	cmd.Dir = repo
	p := startCmd(t, cmd)
	p.waitEntry("checkpoint committed", time.Minute, nil)
	var silent []net.Conn
	t.Cleanup(func() {
		for _, c := range silent {
			c.Close()
		}
	})
	for range 200 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		silent = append(silent, c)
	}
	before := len(p.entries("checkpoint committed"))
	p.waitCount("checkpoint committed", before+3, time.Minute)
	if p.has(`too many open files`) {
		t.Fatal("the agent ran out of file descriptors")
	}
	l := p.waitEntry("connection cap lowered to a quarter of the file descriptor limit", time.Second, nil)
	if got := l.num("max_connections"); got != 16 {
		t.Fatalf("max_connections=%d, want 16 (64/4)", got)
	}
	p.waitEntry("connection refused: too many connections", 10*time.Second, nil)
	p.signal(syscall.SIGTERM)
	p.waitEntry("interruption checkpoint committed: stopping the trainer", time.Minute, nil)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d", code)
	}
}

// TestHardeningSock_PartialLines: the repro scaled down: 40
// connections each send 1 MiB - 100 bytes without a newline. The agent
// holds at most 16 MiB of unfinished lines: the connections past that are
// closed at once with an error, the rest when their line is not finished
// within 10 s; the trainer keeps committing throughout.
func TestHardeningSock_PartialLines(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	const conns, part, budget = 40, 1<<20 - 100, 16 << 20
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "a.sock")
	p := start(t, nil, append(hostileArgs(dir), writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("checkpoint committed", time.Minute, nil)
	blob := []byte(strings.Repeat("x", part))
	errs := make(chan string, conns)
	for range conns {
		c := dialRaw(t, sock)
		go func() {
			c.c.SetWriteDeadline(time.Now().Add(time.Minute))
			c.c.Write(blob) // may fail once the agent closes it
			m, err := c.recv(time.Minute)
			if err != nil {
				errs <- "recv: " + err.Error()
				return
			}
			e, _ := m["error"].(string)
			errs <- e
		}()
	}
	budgetClosed, timedOut := 0, 0
	for range conns {
		select {
		case e := <-errs:
			switch {
			case strings.Contains(e, "too many unfinished lines"):
				budgetClosed++
			case strings.Contains(e, "line not finished within 10s"):
				timedOut++
			default:
				t.Fatalf("reply %q, want a budget or line timeout error", e)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%d budget refusals, %d timeouts: the rest still open", budgetClosed, timedOut)
		}
	}
	t.Logf("%d connections closed over the budget, %d at the line timeout", budgetClosed, timedOut)
	if budgetClosed < conns-budget/part {
		t.Fatalf("%d closed over the budget, want at least %d", budgetClosed, conns-budget/part)
	}
	for _, e := range p.entries("line buffer budget exceeded: closing the connection") {
		if b := e.num("buffered_bytes"); b > budget {
			t.Fatalf("buffered_bytes=%d, over the %d budget", b, budget)
		}
	}
	p.waitCount("checkpoint committed", len(p.entries("checkpoint committed"))+1, time.Minute)
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d", code)
	}
}

// nobodyHello says hello for a run id as nobody and prints the reply's
// type and error. With "until" it retries until welcomed (30 s at most).
const nobodyHello = `
import json, socket, sys, time
path, run, mode = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.time() + 30
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(10)
    s.sendall((json.dumps({"type": "hello", "pid": 1, "run_id": run}) + "\n").encode())
    line = s.makefile().readline()
    m = json.loads(line) if line else {"type": "eof"}
    if mode == "once" or m["type"] == "welcome" or time.time() > deadline:
        print(m["type"], m.get("error", ""))
        break
    s.close()
    time.sleep(0.1)
`

// TestHardeningSock_NodeRunBinding: on a node agent, a run id belongs to
// the peer whose trainers are connected to it (a pod; here, outside
// Kubernetes, a uid): another uid's hello for it is refused while they
// are connected, and welcomed once they are gone.
func TestHardeningSock_NodeRunBinding(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := sharedTemp(t)
	sock := filepath.Join(dir, "node.sock")
	p := start(t, nil, "node", "--store-prefix", "file://"+filepath.Join(dir, "runs"), "--checkpoint-root", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1h", "--log-format", "json")
	p.waitEntry("socket listening", time.Minute, nil)

	owner := dialRaw(t, sock)
	owner.send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "teamB"})
	if m, err := owner.recv(time.Minute); err != nil || m["type"] != "welcome" {
		t.Fatalf("owner's hello: %v %v, want welcome", m, err)
	}
	out := asNobody(t, nobodyHello, sock, "teamB", "once")
	if !strings.HasPrefix(out, "error ") || !strings.Contains(out, "in use by another pod or user") {
		t.Fatalf("nobody's hello for teamB: %q, want refused", out)
	}
	e := p.waitEntry("node: hello refused: run id in use by another peer", 10*time.Second, nil)
	if e.str("peer") != "uid:65534" || e.str("owner") != "uid:0" {
		t.Fatalf("refusal logged peer %q owner %q, want uid:65534 and uid:0", e.str("peer"), e.str("owner"))
	}
	if out := asNobody(t, nobodyHello, sock, "teamC", "once"); !strings.HasPrefix(out, "welcome") {
		t.Fatalf("nobody's hello for its own run: %q, want welcome", out)
	}
	owner.c.Close()
	if out := asNobody(t, nobodyHello, sock, "teamB", "until"); !strings.HasPrefix(out, "welcome") {
		t.Fatalf("nobody's hello for teamB once the owner left: %q, want welcome", out)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("node exit code %d", code)
	}
}
