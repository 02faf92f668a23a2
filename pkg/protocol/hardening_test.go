package protocol

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Issue 13, items 1 and 6: what a hostile local user can do to the socket.

func TestListen_PrivateDir(t *testing.T) {
	listen := func(dir string) (*Server, error) {
		s, err := Listen(ServerConfig{Path: filepath.Join(dir, "a.sock"), PrivateDir: true})
		if err == nil {
			t.Cleanup(func() { s.Close() })
		}
		return s, err
	}
	t.Run("Created0700", func(t *testing.T) {
		dir := filepath.Join(testutil.ShortDir(t), "spotagent-0")
		if _, err := listen(dir); err != nil {
			t.Fatalf("Listen: %v", err)
		}
		fi, err := os.Lstat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != os.ModeDir|0o700 {
			t.Errorf("dir mode %s, want drwx------", got)
		}
	})
	t.Run("OwnExisting", func(t *testing.T) {
		dir := filepath.Join(testutil.ShortDir(t), "own")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := listen(dir); err != nil {
			t.Fatalf("Listen in our own 0700 dir: %v", err)
		}
	})
	t.Run("RelativePath", func(t *testing.T) {
		// The default's TMPDIR may be relative (TMPDIR=tmp): the walk
		// takes an absolute path, and refused this one.
		t.Chdir(testutil.ShortDir(t))
		if _, err := listen(filepath.Join("tmp", "spotagent-0")); err != nil {
			t.Fatalf("Listen in a relative private dir: %v", err)
		}
	})
	t.Run("StickyParent", func(t *testing.T) {
		parent := testutil.ShortDir(t)
		if err := os.Chmod(parent, os.ModeSticky|0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := listen(filepath.Join(parent, "d")); err != nil {
			t.Fatalf("Listen under a sticky 1777 parent (like /tmp): %v", err)
		}
	})
	t.Run("WritableGrandparent", func(t *testing.T) {
		// Any directory on the way, not the parent alone: whoever can
		// write /shared can rename /shared/team (and the socket dir in it) away.
		shared := testutil.ShortDir(t)
		if err := os.Chmod(shared, 0o777); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(shared, "team", "spotagent-0")
		_, err := listen(dir)
		if err == nil || !strings.Contains(err.Error(), shared+" is writable by group or others without the sticky bit") {
			t.Fatalf("Listen: %v, want a refusal naming %s", err, shared)
		}
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("the refused dir was made: %v", err)
		}
	})
	refused := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"GroupOtherBits", func(t *testing.T, dir string) {
			mkdirMode(t, dir, 0o777)
		}, "want no group or other permissions"},
		{"GroupReadable", func(t *testing.T, dir string) {
			mkdirMode(t, dir, 0o750)
		}, "want no group or other permissions"},
		{"Symlink", func(t *testing.T, dir string) {
			target := filepath.Join(filepath.Dir(dir), "target")
			mkdirMode(t, target, 0o700)
			if err := os.Symlink(target, dir); err != nil {
				t.Fatal(err)
			}
		}, "is a symlink"},
		{"RegularFile", func(t *testing.T, dir string) {
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a directory"},
		{"ForeignOwner", func(t *testing.T, dir string) {
			needRoot(t)
			mkdirMode(t, dir, 0o700)
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 65534"},
		{"WritableParent", func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Dir(dir), 0o777); err != nil {
				t.Fatal(err)
			}
		}, "writable by group or others without the sticky bit"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(testutil.ShortDir(t), "spotagent-0")
			tc.setup(t, dir)
			before, _ := os.Lstat(dir)
			_, err := listen(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Listen: %v, want an error containing %q", err, tc.want)
			}
			if before != nil {
				after, err := os.Lstat(dir)
				if err != nil || after.Mode() != before.Mode() {
					t.Errorf("dir changed by a refused Listen: %v -> %v (%v)", before.Mode(), after, err)
				}
			}
			if _, err := os.Lstat(filepath.Join(dir, "a.sock")); err == nil {
				t.Error("a socket was created in a refused dir")
			}
		})
	}
}

func TestListen_ConfiguredDir(t *testing.T) {
	t.Run("SymlinkRefused", func(t *testing.T) {
		base := testutil.ShortDir(t)
		mkdirMode(t, filepath.Join(base, "real"), 0o700)
		if err := os.Symlink(filepath.Join(base, "real"), filepath.Join(base, "link")); err != nil {
			t.Fatal(err)
		}
		s, err := Listen(ServerConfig{Path: filepath.Join(base, "link", "a.sock")})
		if err == nil {
			s.Close()
			t.Fatal("Listen in a symlinked dir succeeded")
		}
		if !strings.Contains(err.Error(), "is a symlink") {
			t.Errorf("err=%v, want 'is a symlink'", err)
		}
	})
	t.Run("WritableWarned", func(t *testing.T) {
		// An emptyDir is 0777: allowed, with a warning.
		dir := filepath.Join(testutil.ShortDir(t), "emptydir")
		mkdirMode(t, dir, 0o777)
		s := startServer(t, ServerConfig{Path: filepath.Join(dir, "a.sock")})
		logs := s.logs.FilterMessageSnippet("other users can replace the socket").All()
		if len(logs) != 1 || !strings.Contains(logs[0].ContextMap()["why"].(string), "writable") {
			t.Errorf("warnings %+v, want one saying the dir is writable", logs)
		}
		s.hello(t, 0)
	})
	t.Run("OwnDirNotWarned", func(t *testing.T) {
		s := startServer(t, ServerConfig{})
		if n := s.logs.FilterMessageSnippet("other users can replace").Len(); n != 0 {
			t.Errorf("%d warnings for a 0700 dir of our own", n)
		}
	})
}

// TestServer_SocketReplaced: in a directory others can write to, the
// socket file is swapped for another user's socket (or removed). The agent
// notices, logs an error and binds a new socket at its path.
func TestServer_SocketReplaced(t *testing.T) {
	replace := func(t *testing.T, path string, uid int) *net.UnixListener {
		t.Helper()
		tmp := path + ".evil"
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		t.Cleanup(func() { ln.Close() })
		if uid != os.Geteuid() {
			if err := os.Chown(tmp, uid, uid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		return ln
	}
	cfg := func() ServerConfig { return ServerConfig{SocketCheck: 10 * time.Millisecond} }
	t.Run("OtherUID", func(t *testing.T) {
		needRoot(t)
		s := startServer(t, cfg())
		evil := replace(t, s.Path(), 65534)
		testutil.WaitFor(t, "the re-created socket", func() bool {
			return s.logs.FilterMessageSnippet("socket file replaced by a socket of uid 65534: re-created it").Len() == 1
		})
		s.hello(t, 0) // reaches this server, not the impostor
		evil.SetDeadline(time.Now())
		if c, err := evil.Accept(); err == nil {
			c.Close()
			t.Error("the impostor's socket got the connection")
		}
	})
	t.Run("Removed", func(t *testing.T) {
		s := startServer(t, cfg())
		if err := os.Remove(s.Path()); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the re-created socket", func() bool {
			return s.logs.FilterMessageSnippet("socket file removed: re-created it").Len() == 1
		})
		s.hello(t, 0)
	})
	t.Run("SameUIDLeftAlone", func(t *testing.T) {
		// A newer agent of the same user took the path: no tug of war.
		s := startServer(t, cfg())
		newer := replace(t, s.Path(), os.Geteuid())
		testutil.WaitFor(t, "the warning", func() bool {
			return s.logs.FilterMessageSnippet("replaced by another socket of this user").Len() == 1
		})
		fi, err := os.Lstat(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		after, err := os.Lstat(s.Path())
		if err != nil || !os.SameFile(fi, after) {
			t.Fatalf("the newer agent's socket was removed or replaced: %v", err)
		}
		_ = newer
	})
}

// TestServer_MaxConns: connections beyond the cap get an error line and
// are closed, so that silent connections cannot eat the agent's fds.
func TestServer_MaxConns(t *testing.T) {
	const max = 4
	s := startServer(t, ServerConfig{MaxConns: max})
	var clients []*client
	for i := range max {
		c, _ := s.hello(t, i)
		clients = append(clients, c)
	}
	for range 3 {
		over := dial(t, s.Path())
		if m := over.read(t); m.Type != TypeError || !strings.Contains(m.Error, "too many connections") {
			t.Fatalf("reply %+v, want a too-many-connections error", m)
		}
		over.SetReadDeadline(time.Now().Add(testutil.Wait))
		if _, err := over.r.ReadByte(); !isEOF(err) {
			t.Fatalf("read after the refusal: %v, want EOF", err)
		}
	}
	if n := len(s.Conns()); n != max {
		t.Fatalf("%d open connections, want %d", n, max)
	}
	if logs := s.logs.FilterMessage("connection refused: too many connections").All(); len(logs) == 0 || logs[0].ContextMap()["max_connections"] != int64(max) {
		t.Errorf("refusal logs %+v, want one with max_connections %d", logs, max)
	}
	// A slot frees when a connection closes.
	clients[0].Close()
	testutil.WaitFor(t, "a free slot", func() bool { return len(s.Conns()) < max })
	for ev := s.nextEvent(t); ev.Msg.Type != TypeDisconnected; ev = s.nextEvent(t) {
	}
	s.hello(t, 9)
}

func TestConnLimit(t *testing.T) {
	n := fdLimit()
	if n <= 0 {
		t.Skip("no open-file limit known")
	}
	if got, want := connLimit(1<<30), max(1, n/4); got != want {
		t.Errorf("connLimit(huge)=%d, want a quarter of the limit %d", got, want)
	}
	if got := connLimit(1); got != 1 {
		t.Errorf("connLimit(1)=%d, want 1", got)
	}
}

// TestServer_HelloTimeout: a connection that never says hello is closed;
// one that said hello may stay silent.
func TestServer_HelloTimeout(t *testing.T) {
	s := startServer(t, ServerConfig{HelloTimeout: 200 * time.Millisecond})
	quiet, quietConn := s.hello(t, 0)
	silent := dial(t, s.Path())
	if m := silent.read(t); m.Type != TypeError || !strings.Contains(m.Error, "no hello within") {
		t.Fatalf("reply %+v, want a no-hello error", m)
	}
	ev := s.nextEvent(t)
	if ev.Msg.Type != TypeDisconnected || !errors.Is(ev.Err, ErrHelloTimeout) {
		t.Fatalf("event %+v err %v, want disconnected with ErrHelloTimeout", ev.Msg, ev.Err)
	}
	// A second silent connection, opened later, times out too, while the
	// trainer that said hello before both is still connected.
	silent2 := dial(t, s.Path())
	if m := silent2.read(t); m.Type != TypeError {
		t.Fatalf("reply %+v, want an error", m)
	}
	if ev := s.nextEvent(t); ev.Conn == quietConn {
		t.Fatalf("the trainer that said hello was closed: %+v %v", ev.Msg, ev.Err)
	}
	quiet.send(t, `{"type":"progress","step":1}`)
	if ev := s.nextEvent(t); ev.Conn != quietConn || ev.Msg.Type != TypeProgress {
		t.Fatalf("event %+v, want the quiet trainer's progress", ev.Msg)
	}
	// Status without hello (spotagent status) is answered within the timeout.
	st := dial(t, s.Path())
	st.send(t, `{"type":"status"}`)
	if ev := s.nextEvent(t); ev.Msg.Type != TypeStatus {
		t.Fatalf("event %+v, want status", ev.Msg)
	}
}

// TestServerConfig_Defaults: the limits docs/reliability.md states for a
// hostile local process, which the agents take unchanged (the CLI sets
// only the socket's path, mode, allowed uids and connection cap).
func TestServerConfig_Defaults(t *testing.T) {
	var cfg ServerConfig
	cfg.defaults()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Mode", cfg.Mode, os.FileMode(0o600)},
		{"MaxConns", cfg.MaxConns, 64},
		{"MaxBuffered", cfg.MaxBuffered, int64(16 << 20)},
		{"LineTimeout", cfg.LineTimeout, 10 * time.Second},
		{"HelloTimeout", cfg.HelloTimeout, 30 * time.Second},
		{"SocketCheck", cfg.SocketCheck, 5 * time.Second},
	} {
		if c.got != c.want {
			t.Errorf("%s=%v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestServer_LineTimeout: a line started and never finished closes its
// connection, and its bytes are no longer held.
func TestServer_LineTimeout(t *testing.T) {
	s := startServer(t, ServerConfig{LineTimeout: 200 * time.Millisecond})
	c, conn := s.hello(t, 0)
	if _, err := c.Write([]byte(`{"type":"progress","st`)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the partial line held", func() bool { return s.Buffered() > 0 })
	if m := c.read(t); m.Type != TypeError || !strings.Contains(m.Error, "line not finished within") {
		t.Fatalf("reply %+v, want a line timeout error", m)
	}
	ev := s.nextEventFor(t, conn.ID())
	if ev.Msg.Type != TypeDisconnected || !errors.Is(ev.Err, ErrLineTimeout) {
		t.Fatalf("event %+v err %v, want disconnected with ErrLineTimeout", ev.Msg, ev.Err)
	}
	if got := s.Buffered(); got != 0 {
		t.Errorf("Buffered()=%d after the connection closed, want 0", got)
	}
}

// TestServer_BufferBudget: many connections each holding most of a 1 MiB
// line without its newline (the issue's repro, scaled down): the bytes
// held never pass the budget, the connections that would pass it are
// closed with an error, and a trainer sending ordinary lines still works.
func TestServer_BufferBudget(t *testing.T) {
	const budget = 2 << 20
	const conns = 8
	const part = maxLine - 100
	s := startServer(t, ServerConfig{MaxBuffered: budget, MaxConns: 64})
	tr, trConn := s.hello(t, 0)

	var wg sync.WaitGroup
	replies := make(chan string, conns)
	for range conns {
		c := dial(t, s.Path())
		wg.Go(func() {
			// A refused connection is closed mid-write: the write may
			// fail, the error line is there to read all the same.
			c.SetWriteDeadline(time.Now().Add(testutil.Wait))
			c.Write([]byte(strings.Repeat("x", part)))
			c.SetReadDeadline(time.Now().Add(testutil.Wait))
			line, err := c.r.ReadString('\n')
			if err != nil {
				replies <- "read: " + err.Error()
				return
			}
			replies <- line
		})
	}
	// Watch the accounted bytes until every connection has either been
	// refused or holds its whole partial line.
	refused := 0
	deadline := time.Now().Add(testutil.Wait)
	for refused+int(s.Buffered()/part) < conns {
		if b := s.Buffered(); b > budget {
			t.Fatalf("Buffered()=%d, over the budget %d", b, budget)
		}
		select {
		case r := <-replies:
			if !strings.Contains(r, "too many unfinished lines") {
				t.Fatalf("reply %q, want the budget error", r)
			}
			refused++
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused %d, buffered %d: not settled", refused, s.Buffered())
		}
		time.Sleep(time.Millisecond) // polling a condition, bounded by deadline
	}
	if refused < conns-budget/part {
		t.Fatalf("%d connections refused, want at least %d", refused, conns-budget/part)
	}
	if n := s.logs.FilterMessage("line buffer budget exceeded: closing the connection").Len(); n < refused {
		t.Errorf("%d budget log lines, want %d", n, refused)
	}
	// Ordinary lines need no budget: the trainer is still served.
	tr.send(t, `{"type":"done","id":"c1","step":5}`)
	if ev := s.nextEventFor(t, trConn.ID()); ev.Msg.Type != TypeDone {
		t.Fatalf("event %+v, want the trainer's done", ev.Msg)
	}
	if b := s.Buffered(); b > budget {
		t.Fatalf("Buffered()=%d, over the budget %d", b, budget)
	}
}

func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(fmt.Sprintf("needs root to chown to another uid (euid %d)", os.Geteuid()))
	}
}
