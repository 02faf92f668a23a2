package integration

import (
	"net"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Issue 13, item 1: silent connections against the real binary under a
// real open-file limit of its own, which an in-process agent cannot have
// (the test's own descriptors, and every other test's, would share it).
// The rest of the socket's hardening is held in-process since #49:
// pkg/protocol TestListen_* and TestServer_* (the listener), pkg/supervisor
// TestAgent_HostileConnections (the agent's loop behind hostile
// connections, the socket replaced), cmd/spotagent TestRun_Socket,
// TestRun_ForeignSocketDir and TestNode_RunBoundToUID (the CLI's wiring,
// the node agent's run binding between real uids).

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
