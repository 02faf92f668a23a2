package protocol

import (
	"strings"
	"testing"
)

// TestServer_NumbersValidated (issue 36 item 5): every number a trainer
// sends is checked where it enters. `world_size: 2^62` in hello used to
// reach pkg/checkpoint and panic in makeslice. A refused message gets an
// error naming the field and reaches nobody; the connection goes on and a
// sane message after it is delivered.
func TestServer_NumbersValidated(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c := dial(t, s.Path())
	for _, tc := range []struct{ line, want string }{
		{`{"type":"hello","pid":1,"rank":0,"world_size":4611686018427387904}`, "hello: world_size 4611686018427387904 out of range (1..1048576)"},
		{`{"type":"hello","pid":1,"world_size":0}`, "hello: world_size 0 out of range"},
		{`{"type":"hello","pid":1,"rank":-1}`, "hello: rank -1 out of range"},
		{`{"type":"hello","pid":1,"rank":2,"world_size":2}`, "hello: rank 2 must be below world_size 2"},
		{`{"type":"hello","pid":1,"local_rank":1,"local_world_size":1}`, "hello: local_rank 1 must be below local_world_size 1"},
		{`{"type":"hello","pid":1,"node_rank":3,"nodes":2}`, "hello: node_rank 3 must be below nodes 2"},
		{`{"type":"hello","pid":1,"nodes":4611686018427387904}`, "hello: nodes 4611686018427387904 out of range"},
		{`{"type":"hello","pid":1,"local_world_size":9,"world_size":8}`, "hello: local_world_size 9 exceeds world_size 8"},
		{`{"type":"hello","pid":1,"nodes":9,"world_size":8}`, "hello: nodes 9 exceeds world_size 8"},
		{`{"type":"hello","pid":-5}`, "hello: pid -5 out of range"},
		{`{"type":"hello","pid":1,"version":-1}`, "hello: version -1 out of range"},
		{`{"type":"progress","step":-1}`, "progress: step is required and must be >= 0"},
		{`{"type":"progress","step":9007199254740993}`, "progress: step 9007199254740993 too large"},
		{`{"type":"done","id":"x","step":-3}`, "done: step is required and must be >= 0"},
		{`{"type":"done","id":"x","step":1,"blocked_ms":-1}`, "done: blocked_ms -1 out of range"},
		{`{"type":"done","id":"x","step":1,"blocked_ms":9223372036854775807}`, "done: blocked_ms 9223372036854775807 out of range"},
		{`{"type":"join","id":"x","step":4611686018427387904}`, "join: step 4611686018427387904 too large"},
	} {
		c.send(t, tc.line)
		m := c.read(t)
		if m.Type != TypeError || !strings.Contains(m.Error, tc.want) {
			t.Errorf("%s: reply %+v, want an error containing %q", tc.line, m, tc.want)
		}
	}
	c.send(t, `{"type":"hello","pid":1,"rank":1,"world_size":8,"local_rank":1,"local_world_size":4,"node_rank":0,"nodes":2}`)
	ev := s.nextEvent(t)
	if ev.Msg.Type != TypeHello || *ev.Msg.WorldSize != 8 {
		t.Fatalf("first event %+v, want the sane hello (nothing refused delivered)", ev.Msg)
	}
}
