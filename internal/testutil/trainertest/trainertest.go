// Package trainertest is a trainer reduced to its socket, driven by a
// test: the protocol's Go Client, its messages read into a channel by one
// goroutine, and failures reported on the test. pkg/supervisor's and node
// mode's tests share it, and so do the end-to-end tests (integration/),
// whose ranks of a simulated job it plays against the real binary.
package trainertest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// Trainer is a protocol client driven by the test.
type Trainer struct {
	t    *testing.T
	c    *protocol.Client
	msgs chan protocol.Message
	// wait bounds each wait: for the socket, for a message.
	wait time.Duration
	// welcome is the agent's answer to the hello (its resume, if any).
	welcome protocol.Message
}

// Dial connects to the socket at path, waiting up to testutil.Wait for it
// to appear; the connection closes when the test ends.
func Dial(t *testing.T, path string) *Trainer {
	t.Helper()
	return DialWithin(t, path, testutil.Wait)
}

// DialWithin is Dial with wait bounding each wait of the Trainer (for the
// socket, for a message) instead of testutil.Wait: an agent binary
// started by the test, on a loaded machine, may take longer.
func DialWithin(t *testing.T, path string, wait time.Duration) *Trainer {
	t.Helper()
	var c *protocol.Client
	deadline := time.Now().Add(wait)
	for {
		var err error
		if c, err = protocol.Dial(context.Background(), path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %s: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the socket to appear, bounded by deadline
	}
	tr := &Trainer{t: t, c: c, msgs: make(chan protocol.Message, 64), wait: wait}
	go func() {
		defer close(tr.msgs)
		for {
			m, err := c.Recv(context.Background())
			if errors.Is(err, protocol.ErrBadMessage) {
				continue
			}
			if err != nil {
				return
			}
			tr.msgs <- m
		}
	}()
	t.Cleanup(func() { c.Close() })
	return tr
}

// Conn is the connection itself, for what the helpers do not say (a send
// whose error the test expects, or ignores).
func (tr *Trainer) Conn() *protocol.Client { return tr.c }

// Close closes the connection: the trainer is gone.
func (tr *Trainer) Close() { tr.c.Close() }

// Msgs is what the agent sent, in order; it closes with the connection.
func (tr *Trainer) Msgs() <-chan protocol.Message { return tr.msgs }

// Send sends m (a Message, or a map of its fields) as one line.
func (tr *Trainer) Send(m any) {
	tr.t.Helper()
	msg, ok := m.(protocol.Message)
	if !ok {
		b, _ := json.Marshal(m)
		if err := json.Unmarshal(b, &msg); err != nil {
			tr.t.Fatalf("send %s: %v", b, err)
		}
	}
	if err := tr.c.Send(context.Background(), msg); err != nil {
		tr.t.Fatalf("send: %v", err)
	}
}

// TrySend sends m, bounded by the Trainer's wait, and returns the error:
// for a test in which the agent may be gone.
func (tr *Trainer) TrySend(m protocol.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), tr.wait)
	defer cancel()
	return tr.c.Send(ctx, m)
}

// Expect returns the next message, which must have type typ.
func (tr *Trainer) Expect(typ string) protocol.Message {
	tr.t.Helper()
	select {
	case m, ok := <-tr.msgs:
		if !ok {
			tr.t.Fatalf("connection closed waiting for %s", typ)
		}
		if m.Type != typ {
			tr.t.Fatalf("got %s (%+v), want %s", m.Type, m, typ)
		}
		return m
	case <-time.After(tr.wait):
		tr.t.Fatalf("no %s message", typ)
	}
	return protocol.Message{}
}

// Next returns the next message of type typ, skipping others; false when
// the connection closed or timeout passed first.
func (tr *Trainer) Next(typ string, timeout time.Duration) (protocol.Message, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-tr.msgs:
			if !ok {
				return protocol.Message{}, false
			}
			if m.Type == typ {
				return m, true
			}
		case <-deadline:
			return protocol.Message{}, false
		}
	}
}

// ExpectClosed waits for the connection to end, skipping what comes first.
func (tr *Trainer) ExpectClosed() {
	tr.t.Helper()
	deadline := time.After(tr.wait)
	for {
		select {
		case _, ok := <-tr.msgs:
			if !ok {
				return
			}
		case <-deadline:
			tr.t.Fatal("connection still open")
		}
	}
}

// Hello says hello as the one rank of a world of 1 and returns the welcome.
func (tr *Trainer) Hello() protocol.Message {
	tr.t.Helper()
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": 0, "world_size": 1})
	tr.welcome = tr.Expect(protocol.TypeWelcome)
	return tr.welcome
}

// HelloJob says hello as global rank r of world, local rank lr of lw on
// node n of nodes, and returns the welcome.
func (tr *Trainer) HelloJob(r, world, lr, lw, n, nodes int) protocol.Message {
	tr.t.Helper()
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": r, "world_size": world,
		"local_rank": lr, "local_world_size": lw, "node_rank": n, "nodes": nodes})
	tr.welcome = tr.Expect(protocol.TypeWelcome)
	return tr.welcome
}

// HelloRank says hello as global rank r of world, perNode ranks a node
// (ranks 0..perNode-1 on node 0, and so on), and returns the welcome.
func (tr *Trainer) HelloRank(r, world, perNode int) protocol.Message {
	tr.t.Helper()
	return tr.HelloJob(r, world, r%perNode, perNode, r/perNode, world/perNode)
}

// Welcome is the agent's answer to the last hello (its resume, if any).
func (tr *Trainer) Welcome() protocol.Message { return tr.welcome }

// Save writes a checkpoint (state.bin holding body) into the request's
// directory and answers done at step.
func (tr *Trainer) Save(req protocol.Message, step int64, body string) {
	tr.t.Helper()
	if err := os.WriteFile(filepath.Join(req.Dir, "state.bin"), []byte(body), 0o600); err != nil {
		tr.t.Fatal(err)
	}
	tr.Send(map[string]any{"type": "done", "id": req.ID, "step": step, "metadata": map[string]int64{"step": step}})
}
