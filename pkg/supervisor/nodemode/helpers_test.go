package nodemode

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// The helpers below are pkg/supervisor's test helpers that node mode's
// tests use (agent_test.go there): a trainer reduced to its socket, and a
// notice source the test feeds.

const testWait = testutil.Wait

// shortDir is a fresh temp dir with a short path: socket paths are limited
// to about 100 bytes, and t.TempDir paths grow with the test name.
func shortDir(t *testing.T) string {
	t.Helper()
	return testutil.ShortDir(t)
}

// trainer is a protocol client driven by the test: a trainer process
// reduced to its socket, speaking through Client.
type trainer struct {
	t    *testing.T
	c    *protocol.Client
	msgs chan protocol.Message
}

func dialTrainer(t *testing.T, path string) *trainer {
	t.Helper()
	var c *protocol.Client
	deadline := time.Now().Add(testWait)
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
	tr := &trainer{t: t, c: c, msgs: make(chan protocol.Message, 64)}
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

// send sends m (a Message, or a map of its fields) as one line.
func (tr *trainer) send(m any) {
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

// expect returns the next message, which must have type typ.
func (tr *trainer) expect(typ string) protocol.Message {
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
	case <-time.After(testWait):
		tr.t.Fatalf("no %s message", typ)
	}
	return protocol.Message{}
}

// save writes a checkpoint into dir and answers done.
func (tr *trainer) save(req protocol.Message, step int64, body string) {
	if err := os.WriteFile(filepath.Join(req.Dir, "state.bin"), []byte(body), 0o600); err != nil {
		tr.t.Fatal(err)
	}
	tr.send(map[string]any{"type": "done", "id": req.ID, "step": step, "metadata": map[string]int64{"step": step}})
}

// fakeSource delivers notices the test pushes.
type fakeSource struct{ ch chan metadata.Notice }

func (f *fakeSource) Cloud() metadata.Cloud { return metadata.CloudAWS }
func (f *fakeSource) Identity(context.Context) (metadata.Identity, error) {
	return metadata.Identity{Cloud: metadata.CloudAWS}, nil
}
func (f *fakeSource) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-f.ch:
			out <- n
		}
	}
}

func mustWrite(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
