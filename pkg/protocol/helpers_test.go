package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

type testServer struct {
	*Server
	logs *observer.ObservedLogs
}

// startServer listens on cfg.Path (a fresh one if empty) and serves until
// the test ends; cleanup checks that Serve returned.
func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = filepath.Join(testutil.ShortDir(t), "agent.sock")
	}
	core, logs := observer.New(zap.DebugLevel)
	cfg.Log = zap.New(core)
	s, err := Listen(cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(testutil.Wait):
			t.Errorf("Serve did not return after cancel")
		}
	})
	return &testServer{Server: s, logs: logs}
}

// nextEvent returns the next event, failing the test after testutil.Wait.
func (s *testServer) nextEvent(t *testing.T) Event {
	t.Helper()
	select {
	case ev, ok := <-s.Events():
		if !ok {
			t.Fatal("events channel closed")
		}
		return ev
	case <-time.After(testutil.Wait):
		t.Fatal("no event")
	}
	return Event{}
}

// nextEventFor skips events of other connections.
func (s *testServer) nextEventFor(t *testing.T, id uint64) Event {
	t.Helper()
	for {
		if ev := s.nextEvent(t); ev.Conn.ID() == id {
			return ev
		}
	}
}

type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, path string) *client {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{Conn: c, r: bufio.NewReaderSize(c, 4<<20)}
}

func (c *client) send(t *testing.T, lines ...string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(testutil.Wait))
	for _, l := range lines {
		if _, err := c.Write([]byte(l + "\n")); err != nil {
			t.Fatalf("write %q: %v", l, err)
		}
	}
}

func (c *client) read(t *testing.T) Message {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(testutil.Wait))
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		t.Fatalf("read: %v (got %q)", err, line)
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("reply %q: %v", line, err)
	}
	return m
}

// hello connects, says hello and returns the client and its server Conn.
func (s *testServer) hello(t *testing.T, rank int) (*client, *Conn) {
	t.Helper()
	c := dial(t, s.Path())
	b, _ := json.Marshal(Message{Type: TypeHello, PID: os.Getpid(), Rank: &rank})
	c.send(t, string(b))
	ev := s.nextEvent(t)
	if ev.Msg.Type != TypeHello || ev.Msg.Rank == nil || *ev.Msg.Rank != rank {
		t.Fatalf("event = %+v, want hello from rank %d", ev.Msg, rank)
	}
	return c, ev.Conn
}

func isEOF(err error) bool {
	return err != nil && (errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "connection reset"))
}
