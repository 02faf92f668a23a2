package jobrank

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestSaveStep plays the agent of one node of two ranks over the real
// protocol: each rank's hello carries its topology; both are asked, save
// their files into their own directory, say done, and are told committed.
func TestSaveStep(t *testing.T) {
	dir := t.TempDir()
	s, err := protocol.Listen(protocol.ServerConfig{Path: filepath.Join(dir, "a.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go s.Serve(ctx)

	agentErr := make(chan string, 1)
	go func() { agentErr <- fakeAgent(s, dir, 2) }()

	ranks := make([]*Rank, 2)
	for i := range ranks {
		if ranks[i], err = Dial(ctx, s.Path(), i, 2, 2); err != nil {
			t.Fatal(err)
		}
		defer ranks[i].C.Close()
		if ranks[i].Welcome.Type != protocol.TypeWelcome {
			t.Fatalf("rank %d: welcome %+v", i, ranks[i].Welcome)
		}
	}
	files := func(r int) map[string][]byte { return map[string][]byte{"rank.bin": {byte(r)}} }
	if err := SaveStep(ctx, ranks, 5, 2, files); err != nil {
		t.Fatal(err)
	}
	if why := <-agentErr; why != "" {
		t.Fatal(why)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, "ckpt", string(rune('0'+r)), "rank.bin"))
		if err != nil || len(b) != 1 || b[0] != byte(r) {
			t.Fatalf("rank %d's file: %v %v", r, b, err)
		}
	}
	if _, err := ranks[0].Next(protocol.TypeCommitted, 50*time.Millisecond); err == nil {
		t.Fatal("Next: a committed that was never sent")
	}
}

// fakeAgent welcomes n ranks (checking their topology), asks each for a
// checkpoint into a directory of its own, waits for every done and says
// committed; "" when all went as the protocol says.
func fakeAgent(s *protocol.Server, dir string, n int) string {
	conns := map[int]*protocol.Conn{}
	for len(conns) < n {
		ev := <-s.Events()
		m := ev.Msg
		if m.Type != protocol.TypeHello {
			continue
		}
		if m.Rank == nil || m.WorldSize == nil || *m.WorldSize != n || m.LocalRank == nil || *m.LocalRank != *m.Rank || m.Nodes == nil || *m.Nodes != 1 {
			return "hello without the rank's topology"
		}
		conns[*m.Rank] = ev.Conn
		ev.Conn.Send(protocol.Message{Type: protocol.TypeWelcome})
	}
	for r, c := range conns {
		d := filepath.Join(dir, "ckpt", string(rune('0'+r)))
		os.MkdirAll(d, 0o700)
		c.Send(protocol.Message{Type: protocol.TypeProgress}) // not what Next waits for: skipped
		c.Send(protocol.Message{Type: protocol.TypeCheckpoint, ID: "c5", Reason: "periodic", Dir: d})
	}
	for done := 0; done < n; {
		ev := <-s.Events()
		if ev.Msg.Type == protocol.TypeDone {
			if ev.Msg.ID != "c5" || ev.Msg.Step == nil || *ev.Msg.Step != 5 {
				return "done without the request's id and step"
			}
			done++
		}
	}
	for _, c := range conns {
		c.Send(protocol.Message{Type: protocol.TypeCommitted, ID: "c5"})
	}
	return ""
}
