package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// The socket as the command line sets it up, on agents run in-process
// (execute): its default path and modes, the flags that change them, the
// connection cap under the open-file limit, the node agent's run binding
// between real uids, and the socket removed at exit (issue 8 and issue 13;
// the end-to-end TestSecurity_SocketPermissions, TestHostile_OtherUID and
// TestHardeningSock_{ForeignDefaultDir,NodeRunBinding} until #49). What
// the listener does with its config is pkg/protocol's (TestListen*,
// TestServer_RefusesOtherUID).

// lockedBuffer is an in-process agent's stderr: its logger writes while
// the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// cliAgent is `spotagent run` or `node` running in-process, its logs in JSON.
type cliAgent struct {
	stderr *lockedBuffer
	done   chan int
	code   int
	exited bool
}

func startCLIAgent(t *testing.T, args ...string) *cliAgent {
	t.Helper()
	a := &cliAgent{stderr: &lockedBuffer{}, done: make(chan int, 1)}
	go func() { a.done <- execute(args, io.Discard, a.stderr) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("spotagent %s's log:\n%s", args[0], a.stderr.String())
		}
	})
	return a
}

// entry waits for the agent's JSON log line with message msg.
func (a *cliAgent) entry(t *testing.T, msg string) map[string]any {
	t.Helper()
	return a.entryWithin(t, msg, testutil.Wait, nil)
}

// entries are the agent's JSON log lines with message msg for which match
// holds (all of them when match is nil), in order.
func (a *cliAgent) entries(msg string, match func(map[string]any) bool) []map[string]any {
	var got []map[string]any
	for _, l := range strings.Split(a.stderr.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) == nil && e["msg"] == msg && (match == nil || match(e)) {
			got = append(got, e)
		}
	}
	return got
}

// entryWithin waits up to within for the agent's first log line with
// message msg for which match holds (nil: any).
func (a *cliAgent) entryWithin(t *testing.T, msg string, within time.Duration, match func(map[string]any) bool) map[string]any {
	t.Helper()
	return a.countWithin(t, msg, 1, within, match)[0]
}

// countWithin waits up to within for n such lines and returns them all; it
// fails the test if the agent exits first.
func (a *cliAgent) countWithin(t *testing.T, msg string, n int, within time.Duration, match func(map[string]any) bool) []map[string]any {
	t.Helper()
	var got []map[string]any
	testutil.WaitWithin(t, fmt.Sprintf("%d %q log lines", n, msg), within, func() bool {
		got = a.entries(msg, match)
		return len(got) >= n || a.ended()
	})
	if len(got) < n {
		t.Fatalf("spotagent exited %d after %d of %d %q lines:\n%s", a.code, len(got), n, msg, a.stderr.String())
	}
	return got
}

func (a *cliAgent) ended() bool {
	if a.exited {
		return true
	}
	select {
	case a.code = <-a.done:
		a.exited = true
	default:
	}
	return a.exited
}

// wait waits for the agent's exit code.
func (a *cliAgent) wait(t *testing.T) int {
	t.Helper()
	return a.waitWithin(t, testutil.Wait)
}

// waitWithin waits up to within for the agent's exit code.
func (a *cliAgent) waitWithin(t *testing.T, within time.Duration) int {
	t.Helper()
	testutil.WaitWithin(t, "spotagent's exit", within, a.ended)
	return a.code
}

// startStoppedAtEnd is startCLIAgent for an agent stopped by this
// process's SIGTERM (sigtermSelf; guardSIGTERM is called here): a test
// that fails half-way stops it in its cleanup, and every other in-process
// agent of the test with it.
func startStoppedAtEnd(t *testing.T, args ...string) *cliAgent {
	t.Helper()
	guardSIGTERM(t)
	a := startCLIAgent(t, args...)
	t.Cleanup(func() {
		if !a.ended() {
			sigtermSelf(t)
			a.waitWithin(t, 2*time.Minute)
		}
	})
	return a
}

// waitingTrainer is a trainer command that exits 0 once the file exit exists.
func waitingTrainer(exit string) []string {
	return []string{"--", "/bin/sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done`, exit}
}

// startRun runs `spotagent run` in-process with the waiting trainer; the
// trainer and the agent end when the test does.
func startRun(t *testing.T, dir, runID string, flags ...string) *cliAgent {
	t.Helper()
	exit := filepath.Join(dir, "exit-"+runID)
	args := append([]string{"run", "--store", "file://" + filepath.Join(dir, "store-"+runID), "--run-id", runID,
		"--checkpoint-dir", filepath.Join(dir, "ckpt-"+runID), "--cloud", "none", "--interval", "1h", "--log-format", "json"}, flags...)
	a := startCLIAgent(t, append(args, waitingTrainer(exit)...)...)
	t.Cleanup(func() {
		testutil.WriteFile(t, exit, "")
		a.wait(t)
	})
	return a
}

// end ends a run's trainer and checks that the agent exits 0 and removes
// its socket.
func (a *cliAgent) end(t *testing.T, dir, runID, sock string) {
	t.Helper()
	testutil.WriteFile(t, filepath.Join(dir, "exit-"+runID), "")
	if code := a.wait(t); code != 0 {
		t.Fatalf("exit code %d, want the trainer's 0:\n%s", code, a.stderr.String())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind after exit: %v", err)
	}
}

func modeOf(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (os.ModeType | os.ModePerm)
}

// statusFinds runs `spotagent status --run-id runID`, which finds the
// default socket the way the agent chose it.
func statusFinds(t *testing.T, runID string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := runStatus(t, []string{"--run-id", runID}, &out, &errb); code != 0 || !strings.Contains(out.String(), "run:             "+runID+"\n") {
		t.Fatalf("spotagent status --run-id %s: exit %d\n%s%s", runID, code, out.String(), errb.String())
	}
}

// TestRun_Socket: where `spotagent run` puts its socket, with which
// modes, and what its flags change; the socket is gone after the agent
// exits. Not parallel: it sets TMPDIR and XDG_RUNTIME_DIR, and lowers the
// process's open-file limit.
func TestRun_Socket(t *testing.T) {
	base := shortTempDir(t)
	t.Run("Default", func(t *testing.T) {
		// $TMPDIR/spotagent-UID/RUN-ID.sock, the directory 0700, the
		// socket 0600, the default connection cap.
		tmp := filepath.Join(base, "tmp")
		if err := os.Mkdir(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("TMPDIR", tmp)
		t.Setenv("XDG_RUNTIME_DIR", "")
		a := startRun(t, base, "perm")
		l := a.entry(t, "socket listening")
		sock := filepath.Join(tmp, "spotagent-"+strconv.Itoa(os.Geteuid()), "perm.sock")
		if l["path"] != sock {
			t.Fatalf("socket at %v, want the default %s", l["path"], sock)
		}
		if got := modeOf(t, filepath.Dir(sock)); got != os.ModeDir|0o700 {
			t.Errorf("socket dir mode %s, want drwx------", got)
		}
		if got := modeOf(t, sock); got != os.ModeSocket|0o600 {
			t.Errorf("socket mode %s, want Srw-------", got)
		}
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		if got, want := l["max_connections"], float64(min(protocol.DefaultMaxConns, int(rl.Cur)/4)); got != want {
			t.Errorf("max_connections=%v, want %v", got, want)
		}
		statusFinds(t, "perm")
		a.end(t, base, "perm", sock)
	})
	t.Run("XDGRuntimeDir", func(t *testing.T) {
		// $XDG_RUNTIME_DIR/spotagent/RUN-ID.sock, the directory 0700.
		xdg := filepath.Join(base, "xdg")
		if err := os.Mkdir(xdg, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Setenv("TMPDIR", filepath.Join(base, "unused"))
		t.Setenv("XDG_RUNTIME_DIR", xdg)
		a := startRun(t, base, "victim")
		sock := filepath.Join(xdg, "spotagent", "victim.sock")
		if got := a.entry(t, "socket listening")["path"]; got != sock {
			t.Fatalf("socket at %v, want %s", got, sock)
		}
		if got := modeOf(t, filepath.Dir(sock)); got != os.ModeDir|0o700 {
			t.Errorf("socket dir mode %s, want drwx------", got)
		}
		statusFinds(t, "victim")
		a.end(t, base, "victim", sock)
	})
	t.Run("Flags", func(t *testing.T) {
		// --socket, --socket-mode, --allow-uid and --max-connections reach
		// the listener (its log line says what it was given).
		sock := filepath.Join(base, "flags", "a.sock")
		a := startRun(t, base, "flags", "--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534,1001", "--max-connections", "9")
		l := a.entry(t, "socket listening")
		for k, want := range map[string]any{"path": sock, "mode": "-rw-rw-rw-", "allow_uids": []any{65534.0, 1001.0}, "max_connections": 9.0} {
			if !reflect.DeepEqual(l[k], want) {
				t.Errorf("socket listening: %s=%v, want %v", k, l[k], want)
			}
		}
		if got := modeOf(t, sock); got != os.ModeSocket|0o666 {
			t.Errorf("socket mode %s, want Srw-rw-rw-", got)
		}
		a.end(t, base, "flags", sock)
	})
	t.Run("OpenFileLimit", func(t *testing.T) {
		// The connection cap is at most a quarter of RLIMIT_NOFILE, so
		// that commits keep the rest (under 128: 32, not the default 64).
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		if rl.Max < 128 {
			t.Skipf("the hard open-file limit is %d: this test lowers the soft one to 128", rl.Max)
		}
		low := rl
		low.Cur = 128
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
				t.Error(err)
			}
		})
		sock := filepath.Join(base, "nofile", "a.sock")
		a := startRun(t, base, "nofile", "--socket", sock)
		l := a.entry(t, "connection cap lowered to a quarter of the file descriptor limit")
		if l["max_connections"] != 32.0 || l["configured"] != float64(protocol.DefaultMaxConns) {
			t.Fatalf("cap lowered: %v, want max_connections 32 of %d configured", l, protocol.DefaultMaxConns)
		}
		if got := a.entry(t, "socket listening")["max_connections"]; got != 32.0 {
			t.Fatalf("socket listening: max_connections=%v, want 32", got)
		}
		a.end(t, base, "nofile", sock)
	})
}

// needRoot fails a test that plays another uid (65534) where it cannot.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test plays uid 65534 and must run as root (euid %d), as CI does", os.Geteuid())
	}
}

// TestRun_ForeignSocketDir: another user pre-created the default socket
// directory, world-writable, to swap its own socket in. The agent refuses
// to start and says why; no trainer runs, the store is not created, and
// the directory is left as it was, empty.
func TestRun_ForeignSocketDir(t *testing.T) {
	needRoot(t)
	base := shortTempDir(t)
	tmp := filepath.Join(base, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, os.ModeSticky|0o777); err != nil { // like /tmp
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	t.Setenv("XDG_RUNTIME_DIR", "")
	sockDir := socketDir()
	if err := os.Mkdir(sockDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sockDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sockDir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	store, marker := filepath.Join(base, "store"), filepath.Join(base, "trainer-ran")
	code, _, errOut := cli(t, "run", "--store", "file://"+store, "--run-id", "victim", "--checkpoint-dir", filepath.Join(base, "ckpt"),
		"--cloud", "none", "--", "/bin/sh", "-c", "touch "+marker)
	if want := "socket dir " + sockDir + " is owned by uid 65534, not 0 (this agent): refusing it"; code != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("exit %d, stderr %q; want 1 saying %q", code, errOut, want)
	}
	for _, p := range []string{marker, store} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists: a start the socket refused went on", p)
		}
	}
	if ents, err := os.ReadDir(sockDir); err != nil || len(ents) != 0 {
		t.Errorf("the foreign dir holds %d entries (%v), want none", len(ents), err)
	}
	if got := modeOf(t, sockDir); got != os.ModeDir|0o777 {
		t.Errorf("the foreign dir's mode changed to %s", got)
	}
}

// nobodyHello says hello for a run id as the node agent's trainer would
// and prints the reply's type and error; with "until" it tries again
// until welcomed (30 s at most).
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

// helloAsNobody runs nobodyHello as uid 65534.
func helloAsNobody(t *testing.T, sock, run, mode string) string {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", nobodyHello, sock, run, mode)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hello as nobody: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestNode_RunBoundToUID: on a node agent opened to another uid
// (--socket-mode 0666 --allow-uid 65534), a run id belongs to the peer
// whose trainers are connected to it, outside Kubernetes its uid: the
// other uid's hello for it is refused while they are connected, and
// welcomed once they are gone; its own run is its own. With pod
// identities: pkg/supervisor/nodemode TestNode_RunBoundToPeer.
func TestNode_RunBoundToUID(t *testing.T) {
	needRoot(t)
	base := shortTempDir(t)
	if err := os.Chmod(base, 0o755); err != nil { // nobody reaches the socket
		t.Fatal(err)
	}
	sock := filepath.Join(base, "node.sock")
	a := startCLIAgent(t, "node", "--store-prefix", "file://"+filepath.Join(base, "runs"), "--checkpoint-root", filepath.Join(base, "ckpt"),
		"--socket", sock, "--socket-mode", "0666", "--allow-uid", "65534", "--cloud", "none", "--interval", "1h", "--log-format", "json")
	// Its signals are this process's: registered before it listens. This
	// test's own registration keeps a SIGTERM that comes after the agent
	// stopped listening for it from killing the test binary (the package's
	// tests must stay sequential: none may run beside a signal to itself).
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGTERM)
	defer signal.Stop(guard)
	a.entry(t, "socket listening")
	t.Cleanup(func() {
		if !a.ended() { // a test that failed half-way
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
			a.wait(t)
		}
	})

	owner, err := protocol.Dial(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Hello(t.Context(), protocol.Message{PID: os.Getpid(), RunID: "teamB"}); err != nil {
		t.Fatalf("owner's hello: %v", err)
	}
	if out := helloAsNobody(t, sock, "teamB", "once"); !strings.HasPrefix(out, "error ") || !strings.Contains(out, "in use by another pod or user") {
		t.Fatalf("nobody's hello for teamB: %q, want refused", out)
	}
	e := a.entry(t, "node: hello refused: run id in use by another peer")
	if e["peer"] != "uid:65534" || e["owner"] != "uid:0" {
		t.Fatalf("refusal logged peer %v owner %v, want uid:65534 and uid:0", e["peer"], e["owner"])
	}
	if out := helloAsNobody(t, sock, "teamC", "once"); !strings.HasPrefix(out, "welcome") {
		t.Fatalf("nobody's hello for its own run: %q, want welcome", out)
	}
	owner.Close()
	if out := helloAsNobody(t, sock, "teamB", "until"); !strings.HasPrefix(out, "welcome") {
		t.Fatalf("nobody's hello for teamB once the owner left: %q, want welcome", out)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t); code != 0 {
		t.Fatalf("node exit code %d, want 0:\n%s", code, a.stderr.String())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind after exit: %v", err)
	}
}
