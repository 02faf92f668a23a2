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
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
)

func TestServer_Hello(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, conn := s.hello(t, 3)

	if got, want := conn.PeerUID(), os.Getuid(); got != want {
		t.Errorf("PeerUID=%d, want %d", got, want)
	}
	if got, want := conn.PeerPID(), os.Getpid(); got != want {
		t.Errorf("PeerPID=%d, want %d", got, want)
	}
	h, ok := conn.Hello()
	if !ok || h.Rank == nil || *h.Rank != 3 || h.PID != os.Getpid() {
		t.Errorf("Hello()=%+v,%v, want rank 3 pid %d", h, ok, os.Getpid())
	}
	if err := conn.Send(Message{Type: TypeWelcome, RunID: "run1", Version: ProtocolVersion}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if m := c.read(t); m.Type != TypeWelcome || m.RunID != "run1" {
		t.Errorf("read %+v, want welcome run1", m)
	}
	if got := len(s.Conns()); got != 1 {
		t.Errorf("len(Conns())=%d, want 1", got)
	}
}

func TestServer_MessageTypes(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, conn := s.hello(t, 0)
	c.send(t,
		`{"type":"progress","step":5}`,
		`{"type":"done","id":"c1","step":5,"metadata":{"epoch":1},"unknown_field":true}`,
		`{"type":"failed","id":"c2","error":"disk full"}`,
		`{"type":"status"}`)
	for _, want := range []string{TypeProgress, TypeDone, TypeFailed, TypeStatus} {
		ev := s.nextEvent(t)
		if ev.Msg.Type != want || ev.Conn != conn {
			t.Fatalf("event %+v, want %s on conn %d", ev.Msg, want, conn.ID())
		}
		if want == TypeDone && (ev.Msg.ID != "c1" || *ev.Msg.Step != 5 || string(ev.Msg.Metadata) != `{"epoch":1}`) {
			t.Errorf("done = %+v", ev.Msg)
		}
	}
}

func TestListen(t *testing.T) {
	t.Run("Mode0600", func(t *testing.T) {
		s := startServer(t, ServerConfig{})
		fi, err := os.Lstat(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("mode=%v, want socket 0600", fi.Mode())
		}
	})
	t.Run("ModeConfigured", func(t *testing.T) {
		s := startServer(t, ServerConfig{Mode: 0o660})
		fi, err := os.Lstat(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o660 {
			t.Errorf("perm=%v, want 0660", got)
		}
	})
	t.Run("ParentDir0700", func(t *testing.T) {
		dir := filepath.Join(testutil.ShortDir(t), "run", "spotagent")
		s := startServer(t, ServerConfig{Path: filepath.Join(dir, "agent.sock")})
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o700 {
			t.Errorf("dir perm=%v, want 0700", got)
		}
		s.hello(t, 0)
	})
	t.Run("StaleSocketReplaced", func(t *testing.T) {
		path := filepath.Join(testutil.ShortDir(t), "agent.sock")
		old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		old.SetUnlinkOnClose(false)
		old.Close()
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("stale socket not left behind: %v", err)
		}
		s := startServer(t, ServerConfig{Path: path})
		s.hello(t, 0)
	})
	t.Run("LiveSocketRefused", func(t *testing.T) {
		// Issue 36 item 8: a second agent bound over the first's live
		// socket without a word.
		first := startServer(t, ServerConfig{})
		before, err := os.Lstat(first.Path())
		if err != nil {
			t.Fatal(err)
		}
		s, err := Listen(ServerConfig{Path: first.Path()})
		if err == nil {
			s.Close()
			t.Fatal("Listen succeeded over a live socket")
		}
		if !errors.Is(err, ErrSocketInUse) {
			t.Errorf("err=%v, want ErrSocketInUse", err)
		}
		if after, err := os.Lstat(first.Path()); err != nil || !os.SameFile(before, after) {
			t.Fatalf("the first agent's socket file was replaced (%v)", err)
		}
		// The first still serves (the probe's own connection ends in a
		// disconnected event, skipped here).
		c := dial(t, first.Path())
		c.send(t, `{"type":"hello","pid":1}`)
		for {
			ev := first.nextEvent(t)
			if ev.Msg.Type == TypeHello {
				break
			}
			if ev.Msg.Type != TypeDisconnected {
				t.Fatalf("event %+v, want the hello", ev.Msg)
			}
		}
	})
	t.Run("RegularFileRefused", func(t *testing.T) {
		path := filepath.Join(testutil.ShortDir(t), "agent.sock")
		if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Listen(ServerConfig{Path: path})
		if err == nil {
			s.Close()
			t.Fatal("Listen succeeded over a regular file")
		}
		if !strings.Contains(err.Error(), "not a socket") {
			t.Errorf("err=%v, want 'not a socket'", err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
			t.Errorf("file after Listen: %q, %v; want it kept", b, err)
		}
	})
	t.Run("SocketRemovedOnExit", func(t *testing.T) {
		path := filepath.Join(testutil.ShortDir(t), "agent.sock")
		s, err := Listen(ServerConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(t.Context()) }()
		s.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve=%v, want nil", err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket still there after Serve: %v", err)
		}
		if _, ok := <-s.Events(); ok {
			t.Error("Events not closed after Serve")
		}
	})
}

func TestServer_BadInput(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, conn := s.hello(t, 0)
	for _, tc := range []struct{ line, want, id string }{
		{`not json`, "malformed json", ""},
		{`{"type":"done"`, "malformed json", ""},
		{`[1,2]`, "malformed json", ""},
		{`null`, "missing type", ""},
		{`{"step":1}`, "missing type", ""},
		{`{"type":"bogus","id":"x1"}`, `unknown message type "bogus"`, "x1"},
		{`{"type":"welcome"}`, `unknown message type "welcome"`, ""},
		{`{"type":"disconnected"}`, `unknown message type "disconnected"`, ""},
	} {
		c.send(t, tc.line)
		m := c.read(t)
		if m.Type != TypeError || !strings.Contains(m.Error, tc.want) || m.ID != tc.id {
			t.Errorf("%s: reply %+v, want error %q id %q", tc.line, m, tc.want, tc.id)
		}
	}
	// Still serving: a blank line is ignored, the next message arrives.
	c.send(t, "", `{"type":"progress","step":9}`)
	if ev := s.nextEvent(t); ev.Msg.Type != TypeProgress || ev.Conn != conn || *ev.Msg.Step != 9 {
		t.Errorf("event %+v, want progress 9", ev.Msg)
	}
}

func TestServer_OversizedLine(t *testing.T) {
	s := startServer(t, ServerConfig{})
	good, goodConn := s.hello(t, 0)
	bad, badConn := s.hello(t, 1)

	// 2 MiB without a newline; the write fails part-way once the agent closes.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		bad.SetWriteDeadline(time.Now().Add(testutil.Wait))
		bad.Write([]byte(`{"type":"progress","pad":"` + strings.Repeat("x", 2<<20)))
	}()
	if m := bad.read(t); m.Type != TypeError || !strings.Contains(m.Error, "line exceeds") {
		t.Errorf("reply %+v, want error 'line exceeds'", m)
	}
	ev := s.nextEventFor(t, badConn.ID())
	if ev.Msg.Type != TypeDisconnected || !errors.Is(ev.Err, ErrLineTooLong) {
		t.Errorf("event %+v err %v, want disconnected ErrLineTooLong", ev.Msg, ev.Err)
	}
	<-wrote
	bad.SetReadDeadline(time.Now().Add(testutil.Wait))
	if _, err := bad.r.ReadByte(); !isEOF(err) {
		t.Errorf("read after error reply: %v, want closed", err)
	}

	// The other connection is unaffected, both ways.
	good.send(t, `{"type":"progress","step":1}`)
	if ev := s.nextEvent(t); ev.Conn != goodConn || ev.Msg.Type != TypeProgress {
		t.Errorf("event %+v, want progress from the good conn", ev.Msg)
	}
	if err := goodConn.Send(Message{Type: TypeStop, Reason: ReasonShutdown}); err != nil {
		t.Fatal(err)
	}
	if m := good.read(t); m.Type != TypeStop {
		t.Errorf("read %+v, want stop", m)
	}
	if got := len(s.Conns()); got != 1 {
		t.Errorf("len(Conns())=%d, want 1", got)
	}
}

func TestServer_LineAtLimit(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, _ := s.hello(t, 0)
	head := `{"type":"failed","id":"big","error":"`
	tail := `"}`
	line := head + strings.Repeat("e", maxLine-1-len(head)-len(tail)) + tail // plus "\n" = maxLine
	c.send(t, line)
	if ev := s.nextEvent(t); ev.Msg.Type != TypeFailed || len(ev.Msg.Error) != maxLine-1-len(head)-len(tail) {
		t.Errorf("event type %q error len %d, want failed with the whole line", ev.Msg.Type, len(ev.Msg.Error))
	}
}

func TestServer_HalfMessageThenClose(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, conn := s.hello(t, 0)
	const half = `{"type":"done","id":"c1","st`
	if _, err := c.Write([]byte(half)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	ev := s.nextEvent(t)
	if ev.Conn != conn || ev.Msg.Type != TypeDisconnected || ev.Err != nil {
		t.Fatalf("event %+v err %v, want disconnected with nil Err", ev.Msg, ev.Err)
	}
	if got := len(s.Conns()); got != 0 {
		t.Errorf("len(Conns())=%d after disconnect, want 0", got)
	}
	logs := s.logs.FilterMessage("connection closed by peer mid-line; partial line discarded").All()
	if len(logs) != 1 || logs[0].ContextMap()["partial_bytes"] != int64(len(half)) {
		t.Errorf("logs=%+v, want one mid-line close with partial_bytes %d", logs, len(half))
	}
}

func TestServer_ManyConns(t *testing.T) {
	const conns, msgs = 16, 200 // 3200 events: the buffer fills, readers block
	s := startServer(t, ServerConfig{})
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for r := range conns {
		wg.Go(func() {
			c, err := net.Dial("unix", s.Path())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			var b strings.Builder
			fmt.Fprintf(&b, "{\"type\":\"hello\",\"rank\":%d}\n", r)
			for i := range msgs {
				fmt.Fprintf(&b, "{\"type\":\"done\",\"id\":\"%d-%d\",\"step\":%d}\n", r, i, i)
			}
			if _, err := c.Write([]byte(b.String())); err != nil {
				errs <- err
			}
		})
	}
	type state struct {
		rank, next int
		gone       bool
	}
	seen := map[uint64]*state{}
	for done := 0; done < conns; {
		ev := s.nextEvent(t)
		st := seen[ev.Conn.ID()]
		switch ev.Msg.Type {
		case TypeHello:
			if st != nil {
				t.Fatalf("second hello on conn %d", ev.Conn.ID())
			}
			seen[ev.Conn.ID()] = &state{rank: *ev.Msg.Rank}
		case TypeDone:
			if want := fmt.Sprintf("%d-%d", st.rank, st.next); ev.Msg.ID != want {
				t.Fatalf("conn %d: done %q, want %q", ev.Conn.ID(), ev.Msg.ID, want)
			}
			st.next++
		case TypeDisconnected:
			if st.next != msgs {
				t.Fatalf("rank %d disconnected after %d of %d messages", st.rank, st.next, msgs)
			}
			st.gone = true
			done++
		default:
			t.Fatalf("unexpected event %+v", ev.Msg)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != conns {
		t.Errorf("saw %d conns, want %d", len(seen), conns)
	}
}

func TestServer_ProgressFloodDropped(t *testing.T) {
	const flood = 5000
	s := startServer(t, ServerConfig{})
	f, floodConn := s.hello(t, 0)
	var b strings.Builder
	for i := range flood {
		fmt.Fprintf(&b, "{\"type\":\"progress\",\"step\":%d}\n", i)
	}
	// Nobody reads Events meanwhile: the trainer must still not block.
	f.send(t, b.String())
	testutil.WaitFor(t, "flood handled", func() bool {
		return int(floodConn.DroppedProgress())+len(s.Events()) == flood
	})
	if got := len(s.Events()); got != EventBuffer {
		t.Errorf("buffered events=%d, want %d", got, EventBuffer)
	}
	other := dial(t, s.Path())
	other.send(t, `{"type":"done","id":"x","step":1}`)
	for i := range EventBuffer {
		if ev := s.nextEvent(t); ev.Msg.Type != TypeProgress || *ev.Msg.Step != int64(i) {
			t.Fatalf("event %d: %+v, want progress %d", i, ev.Msg, i)
		}
	}
	if ev := s.nextEvent(t); ev.Msg.Type != TypeDone || ev.Msg.ID != "x" {
		t.Errorf("event %+v, want the other conn's done", ev.Msg)
	}
}

func TestServer_Broadcast(t *testing.T) {
	s := startServer(t, ServerConfig{})
	a, _ := s.hello(t, 0)
	b, _ := s.hello(t, 1)
	silent := dial(t, s.Path())
	silent.send(t, `{"type":"status"}`)
	silentConn := s.nextEvent(t).Conn

	s.Broadcast(Message{Type: TypeStop, Reason: ReasonInterruption})
	for i, c := range []*client{a, b} {
		if m := c.read(t); m.Type != TypeStop || m.Reason != ReasonInterruption {
			t.Errorf("conn %d read %+v, want stop", i, m)
		}
	}
	// The conn without hello got nothing: its first line is this one.
	if err := silentConn.Send(Message{Type: TypeError, Error: "direct"}); err != nil {
		t.Fatal(err)
	}
	if m := silent.read(t); m.Error != "direct" {
		t.Errorf("conn without hello read %+v first, want the direct message", m)
	}
}

func TestConn_SendDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	s := startServer(t, ServerConfig{WriteTimeout: timeout})
	_, conn := s.hello(t, 0) // the client never reads
	big := Message{Type: TypeError, Error: strings.Repeat("z", 256<<10)}
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		start := time.Now()
		err = conn.Send(big)
		if d := time.Since(start); d > timeout+2*time.Second {
			t.Fatalf("Send %d took %v, want at most about %v", i, d, timeout)
		}
	}
	if err == nil {
		t.Fatal("Send never failed to a trainer that does not read")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("err=%v, want deadline exceeded", err)
	}
	ev := s.nextEvent(t)
	if ev.Conn != conn || ev.Msg.Type != TypeDisconnected || !errors.Is(ev.Err, os.ErrDeadlineExceeded) {
		t.Errorf("event %+v err %v, want disconnected with the send error", ev.Msg, ev.Err)
	}
	if err := conn.Send(Message{Type: TypeStop}); !errors.Is(err, ErrConnClosed) {
		t.Errorf("Send after failure: %v, want ErrConnClosed", err)
	}
}

func TestConn_Close(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c, conn := s.hello(t, 0)
	conn.Close()
	ev := s.nextEvent(t)
	if ev.Msg.Type != TypeDisconnected || !errors.Is(ev.Err, ErrConnClosed) {
		t.Errorf("event %+v err %v, want disconnected ErrConnClosed", ev.Msg, ev.Err)
	}
	c.SetReadDeadline(time.Now().Add(testutil.Wait))
	if _, err := c.r.ReadByte(); !isEOF(err) {
		t.Errorf("client read: %v, want EOF", err)
	}
}

// One message per event (issue 36, review): a status call (connect, ask,
// close) logs one info line, its close; the accept is at debug.
func TestServer_StatusCallLogsOnce(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c := dial(t, s.Path())
	c.send(t, `{"type":"status"}`)
	if ev := s.nextEvent(t); ev.Msg.Type != TypeStatus {
		t.Fatalf("event %+v, want status", ev.Msg)
	}
	c.Close()
	if ev := s.nextEvent(t); ev.Msg.Type != TypeDisconnected {
		t.Fatalf("event %+v, want disconnected", ev.Msg)
	}
	info := s.logs.Filter(func(e observer.LoggedEntry) bool {
		_, ofConn := e.ContextMap()["conn"]
		return e.Level >= zap.InfoLevel && ofConn
	}).All()
	if len(info) != 1 || info[0].Message != "connection closed by peer" {
		t.Fatalf("info lines %+v, want one: connection closed by peer", info)
	}
}

// Sends to a peer that reads nothing, inside a synctest bubble (the
// agent's simulation serves its trainers over net.Pipe): the first blocks
// in its write until WriteTimeout; the others wait their turn, durably
// blocked, so that the bubble's clock runs on to that deadline; then the
// connection is closed and every Send returns its error. A Send waiting
// on a mutex instead stopped the clock (the agent's simulation, seed
// 14569: its watchdog fired).
func TestSendsBehindABlockedOneInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := NewPipes(ServerConfig{WriteTimeout: 5 * time.Second})
		peer := srv.Pipe(1) // reads nothing
		defer peer.Close()
		srv.mu.Lock()
		var c *Conn
		for _, c = range srv.conns {
		}
		srv.mu.Unlock()
		start := time.Now()
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- c.Send(Message{Type: TypeError, Error: "x"}) }()
		}
		for range 3 {
			if err := <-errs; err == nil {
				t.Error("a Send to a peer that reads nothing returned nil")
			}
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Errorf("the Sends returned after %s of fake time, want the write timeout (5s)", d)
		}
		srv.ClosePipes()
	})
}
