package supervisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestOwner_AnswerOfAClosedConnection (issue 36 item 6): the owner rule
// used to look up each answering trainer's uid through its open
// connection, and skipped one that had closed: a trainer of another user
// that sent done and disconnected before the request settled had its
// files uploaded unchecked (a hard link to a root-only file committed).
// The uid is now kept from the answer: the rule holds after the close.
func TestOwner_AnswerOfAClosedConnection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the trainer runs as uid 65534")
	}
	const nobody = 65534
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a.sock")
	srv, err := protocol.Listen(protocol.ServerConfig{Path: sock, Mode: 0o666, AllowUIDs: []int{nobody}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx)
	defer srv.Close()
	py := exec.Command("/usr/bin/python3", "-c", `
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"type":"hello","pid":1}\n')
s.makefile("rb").readline()
s.close()
`, sock)
	py.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	py.Stderr = os.Stderr
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	var c *protocol.Conn
	for c == nil {
		select {
		case ev := <-srv.Events():
			if ev.Msg.Type == protocol.TypeHello {
				c = ev.Conn
				c.Send(protocol.Message{Type: protocol.TypeWelcome})
			}
		case <-time.After(testutil.Wait):
			t.Fatal("no hello")
		}
	}
	if err := py.Wait(); err != nil {
		t.Fatalf("trainer as uid %d: %v", nobody, err)
	}
	r := &request{answeredBy: map[uint64]bool{}}
	r.noteAnswer(c)
	c.Close() // the connection is gone: the uids come from the answer alone
	if got := r.ownerUIDs(); !slices.Equal(got, []int{nobody}) {
		t.Fatalf("owner uids %v after the trainer closed, want [%d]", got, nobody)
	}
}

// TestGoBg_PanicFailsTheWork (issue 36 item 5): a panic in background
// work is recovered and logged with its stack; work whose result the loop
// waits for reports it as its error.
func TestGoBg_PanicFailsTheWork(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	a := &Agent{log: zap.New(core)}
	failed := make(chan error, 1)
	a.goBgFail(func() { panic("boom") }, func(err error) { failed <- err })
	a.goBg(func() { panic("bang") })
	a.bg.Wait()
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "internal error (panic): boom") {
			t.Fatalf("error %v, want the panic", err)
		}
	default:
		t.Fatal("the failed work reported nothing")
	}
	if got := logs.FilterMessage("background work panicked: it fails, the agent goes on").Len(); got != 2 {
		t.Fatalf("%d panics logged, want 2", got)
	}
}
