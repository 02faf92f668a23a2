package integration

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// silentClient connects, says hello without a rank and never answers
// anything; it prints each message type it gets, one a line, until EOF.
const silentClient = `
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"type":"hello","pid":1}\n')
f = s.makefile("rb")
for line in f:
    print(json.loads(line)["type"], flush=True)
`

// TestHostile_SilentClientHoldsNoCheckpoint (issue 36, review): another
// local uid connects to the trainer's socket, says hello with no rank and
// then stays silent. It is no rank of the job: checkpoint requests never
// go to it nor wait for it, and the shutdown checkpoint commits as if it
// were not there (before, every request waited for it until its deadline
// and the shutdown checkpoint failed: the work since the last commit was
// lost).
func TestHostile_SilentClientHoldsNoCheckpoint(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := sharedTemp(t)
	sock := filepath.Join(dir, "a.sock")
	// The job's one trainer (no rank): it saves whenever asked and stops when told.
	p := start(t, nil, append(hostileArgs(dir, "--socket-mode", "0666", "--allow-uid", "65534", "--term-grace", "30s", "--interval", "500ms"),
		append([]string{"--"}, fakeTrainer()...)...)...)
	p.waitEntry("trainer connected", time.Minute, nil)

	silent := exec.Command(python, "-c", silentClient, sock)
	silent.Dir = "/"
	silent.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var got bytes.Buffer
	silent.Stdout, silent.Stderr = &got, &got
	if err := silent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Process.Kill(); silent.Wait() })
	left := p.waitEntry("connection is not one of the job's declared ranks: checkpoints never wait for it", time.Minute, nil)
	if left.num("peer_uid") != 65534 {
		t.Fatalf("left out: peer_uid %d, want 65534", left.num("peer_uid"))
	}
	if !strings.Contains(left.str("why"), "single-process") {
		t.Fatalf("left out because %q, want the single-process rule", left.str("why"))
	}
	// Periodic checkpoints commit beside it.
	before := len(p.entries("checkpoint committed"))
	p.waitCount("checkpoint committed", before+2, time.Minute)

	// One message per event (issue 36, review): the child's start and each
	// connection are logged once (the silent one as left out, above), a
	// status call not at all until it closes.
	for msg, want := range map[string]int{"trainer started": 1, "child started": 0, "trainer connected": 1, "connection accepted": 0} {
		if n := len(p.entries(msg)); n != want {
			t.Errorf("%d %q lines, want %d", n, msg, want)
		}
	}

	p.signal(syscall.SIGTERM)
	done := p.waitEntry("interruption checkpoint committed: stopping the trainer", time.Minute, nil)
	if code := p.wait(time.Minute); code != exitInterrupted && code != 0 {
		t.Fatalf("exit code %d, want 0 or %d", code, exitInterrupted)
	}
	if n := len(p.entries("trainer missed the checkpoint deadline")); n != 0 {
		t.Fatalf("%d requests missed their deadline, want none", n)
	}
	if step, _ := storeLatest(t, filepath.Join(dir, "store")); step != done.num("step") {
		t.Fatalf("latest step %d, want the shutdown checkpoint's %d", step, done.num("step"))
	}
	silent.Wait()
	if out := got.String(); strings.Contains(out, "checkpoint\n") || !strings.Contains(out, "welcome\n") {
		t.Fatalf("the silent client got:\n%s\nwant a welcome and no checkpoint request", out)
	}
}
