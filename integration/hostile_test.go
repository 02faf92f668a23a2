package integration

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Hostile or broken trainers (issue 8): whatever a trainer does, the agent
// stays up, other connections keep working, a committed checkpoint is never
// replaced by a bad one, and each case has a clear log line.

// TestHostile_Connections: beside a healthy trainer, connections that send
// a 10 MiB line, a flood of 100k messages, or half a message and close. The
// agent answers every other connection promptly throughout, and the trainer
// keeps committing checkpoints.
func TestHostile_Connections(t *testing.T) {
	parallelBusy(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "a.sock")
	p := start(t, nil, append(hostileArgs(dir), writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("checkpoint committed", time.Minute, nil)

	t.Run("LineTooLong", func(t *testing.T) {
		c := dialRaw(t, sock)
		go func() {
			// The agent closes the connection after 1 MiB: this write fails.
			c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			c.c.Write(append(bytes.Repeat([]byte("a"), 10<<20), '\n'))
		}()
		m, err := c.recv(30 * time.Second)
		if err != nil || m["type"] != "error" || !strings.Contains(m["error"].(string), "line exceeds") {
			t.Fatalf("reply %v %v, want an error about the line length", m, err)
		}
		if _, err := c.recv(30 * time.Second); !errors.Is(err, io.EOF) && !isConnReset(err) {
			t.Fatalf("after the error: %v, want the connection closed", err)
		}
		p.waitEntry("connection closed", 10*time.Second, func(e logEntry) bool { return e.str("error") == "line too long" })
		if _, took := dialRaw(t, sock).status(10 * time.Second); took > 4*time.Second { // slack for a loaded machine
			t.Fatalf("status took %s after the long line", took)
		}
	})

	t.Run("Flood", func(t *testing.T) {
		const n = 100_000
		closedBefore := len(p.entries("connection closed by peer"))
		flood := dialRaw(t, sock)
		var buf bytes.Buffer
		for i := 1; i <= n; i++ {
			buf.WriteString(`{"type":"progress","step":`)
			buf.WriteString(strconv.Itoa(i))
			buf.WriteString("}\n")
		}
		sent := make(chan error, 1)
		go func() {
			flood.c.SetWriteDeadline(time.Now().Add(time.Minute))
			_, err := flood.c.Write(buf.Bytes())
			sent <- err
		}()
		probe := dialRaw(t, sock)
		var worst time.Duration
		probes := 0
		for done := false; !done; {
			select {
			case err := <-sent:
				if err != nil {
					t.Fatalf("flood write: %v", err)
				}
				done = true
			default:
			}
			_, took := probe.status(5 * time.Second)
			worst = max(worst, took)
			probes++
		}
		t.Logf("flood of %d lines (%d bytes): %d status probes, slowest reply %s", n, buf.Len(), probes, worst)
		if worst > 3*time.Second { // starved would be the 5 s probe timeout; slack for a loaded machine
			t.Fatalf("a status reply took %s during the flood, want under 3s", worst)
		}
		// The flooding connection itself is still served once it is done.
		if st, _ := flood.status(10 * time.Second); st["step"].(float64) <= 0 {
			t.Fatalf("status after the flood: step %v, want the flood's progress seen", st["step"])
		}
		flood.c.Close()
		es := p.waitCount("connection closed by peer", closedBefore+1, 10*time.Second)
		t.Logf("flood connection closed: dropped_progress=%d", es[len(es)-1].num("dropped_progress"))
	})

	t.Run("HalfMessage", func(t *testing.T) {
		c := dialRaw(t, sock)
		if _, err := c.c.Write([]byte(`{"type":"hel`)); err != nil {
			t.Fatal(err)
		}
		c.c.Close()
		e := p.waitEntry("connection closed by peer mid-line; partial line discarded", 10*time.Second, nil)
		if got := e.num("partial_bytes"); got != 12 {
			t.Fatalf("partial_bytes=%d, want 12", got)
		}
	})

	// The trainer's connection was never disturbed: one more checkpoint
	// commits, then a clean shutdown.
	p.waitCount("checkpoint committed", len(p.entries("checkpoint committed"))+1, time.Minute)
	p.signal(syscall.SIGTERM)
	p.waitEntry("interruption checkpoint committed: stopping the trainer", time.Minute, nil)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
}

// TestHostile_OtherUID: with the socket opened to everyone (mode 0666, in a
// world-readable directory), a process running as nobody still cannot talk
// to the agent: the peer uid check refuses it, and logs it.
func TestHostile_OtherUID(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "a.sock")
	args := hostileArgs(dir, "--socket", sock, "--socket-mode", "0666")
	p := start(t, nil, append(args, writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("checkpoint committed", time.Minute, nil)

	out := asNobody(t, nobodyConnect, sock)
	if out != "eof" && out != "reset" {
		t.Fatalf("nobody's connection: %q, want it closed without an answer", out)
	}
	e := p.waitEntry("connection refused: peer uid not allowed", 10*time.Second, nil)
	if got := e.num("uid"); got != 65534 {
		t.Fatalf("refused uid %d, want 65534", got)
	}
	if _, took := dialRaw(t, sock).status(10 * time.Second); took > 4*time.Second { // slack for a loaded machine
		t.Fatalf("status took %s", took)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}
