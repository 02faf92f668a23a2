package trainers

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// server serves a real socket; hello dials it, says hello as a trainer
// and returns the agent's side of that connection.
type server struct {
	t    *testing.T
	srv  *protocol.Server
	path string
}

func serve(t *testing.T) *server {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t), "s.sock")
	srv, err := protocol.Listen(protocol.ServerConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); srv.Close(); <-done })
	return &server{t: t, srv: srv, path: path}
}

func (s *server) hello(hello map[string]any) (*trainertest.Trainer, *protocol.Conn) {
	s.t.Helper()
	tr := trainertest.Dial(s.t, s.path)
	hello["type"] = protocol.TypeHello
	tr.Send(hello)
	ev := s.next(protocol.TypeHello)
	return tr, ev.Conn
}

func (s *server) next(typ string) protocol.Event {
	s.t.Helper()
	select {
	case ev := <-s.srv.Events():
		if ev.Msg.Type != typ {
			s.t.Fatalf("event %s, want %s", ev.Msg.Type, typ)
		}
		return ev
	case <-time.After(testutil.Wait):
		s.t.Fatalf("no %s event", typ)
	}
	return protocol.Event{}
}

func TestConns_FinishedOnlyAfterEveryTrainerSaidBye(t *testing.T) {
	s := serve(t)
	c := New(zap.NewNop(), nil)
	if c.Finished() || c.Had() || c.Count() != 0 {
		t.Fatal("no trainer yet: finished, or one had come")
	}
	_, a := s.hello(map[string]any{"pid": 1})
	if why := c.Welcomed(a); why != "" {
		t.Fatalf("the first trainer left out: %s", why)
	}
	if !c.Had() || c.Count() != 1 || c.Conn(a.ID()) != a {
		t.Fatalf("welcomed: had %v count %d", c.Had(), c.Count())
	}
	c.Bye(a.ID())
	if !c.SaidBye(a.ID()) || c.Finished() {
		t.Fatalf("said bye, still connected: said %v finished %v (want true, false)", c.SaidBye(a.ID()), c.Finished())
	}
	c.Disconnected(a.ID())
	if !c.Finished() || c.Count() != 0 || c.SaidBye(a.ID()) {
		t.Fatalf("bye then gone: finished %v count %d (want finished, none left, its bye forgotten)", c.Finished(), c.Count())
	}

	// A trainer of a new start that leaves without bye: not finished.
	_, b := s.hello(map[string]any{"pid": 2})
	c.Welcomed(b)
	c.Disconnected(b.ID())
	if c.Finished() {
		t.Fatal("a trainer left without bye: finished")
	}
	// The next start begins again: its bye counts.
	_, d := s.hello(map[string]any{"pid": 3})
	c.Welcomed(d)
	c.Bye(d.ID())
	c.Disconnected(d.ID())
	if !c.Finished() {
		t.Fatal("the new start's trainer said bye and left: not finished")
	}
}

func TestConns_ByeOfAStrangerIsNotCounted(t *testing.T) {
	s := serve(t)
	c := New(zap.NewNop(), nil)
	_, a := s.hello(map[string]any{"pid": 1})
	c.Bye(a.ID()) // never welcomed
	c.Disconnected(a.ID())
	if c.Finished() || c.Had() {
		t.Fatalf("a connection never welcomed said bye: finished %v had %v", c.Finished(), c.Had())
	}
}

func TestConns_LeftOutGoesLastAndAnswerBringsItBack(t *testing.T) {
	s := serve(t)
	c := New(zap.NewNop(), nil)
	_, first := s.hello(map[string]any{"pid": 1})
	_, second := s.hello(map[string]any{"pid": 2})
	c.Welcomed(first)
	if why := c.Welcomed(second); why == "" {
		t.Fatal("a second trainer without rank is one of the job's ranks")
	}
	ranks, shape, _ := c.JobRanks()
	if len(ranks) != 1 || ranks[first.ID()] == nil || shape.Ranked {
		t.Fatalf("ranks %v shape %+v, want the first trainer alone", ranks, shape)
	}
	// The first goes; the one left out takes its place.
	c.Disconnected(first.ID())
	if ranks, _, _ := c.JobRanks(); ranks[second.ID()] == nil {
		t.Fatal("the only trainer left is not the job's")
	}
}

func TestConns_BroadcastReachesEveryTrainer(t *testing.T) {
	s := serve(t)
	c := New(zap.NewNop(), nil)
	tra, a := s.hello(map[string]any{"pid": 1})
	trb, b := s.hello(map[string]any{"pid": 2})
	c.Welcomed(a)
	c.Welcomed(b)
	c.Broadcast(protocol.Message{Type: protocol.TypeStop, Reason: protocol.ReasonShutdown})
	for _, tr := range []*trainertest.Trainer{tra, trb} {
		if m := tr.Expect(protocol.TypeStop); m.Reason != protocol.ReasonShutdown {
			t.Fatalf("stop reason %q, want %q", m.Reason, protocol.ReasonShutdown)
		}
	}
	c.Reply(a, "x1", "no")
	if m := tra.Expect(protocol.TypeError); m.ID != "x1" || m.Error != "no" {
		t.Fatalf("reply %+v, want error x1 no", m)
	}
}
