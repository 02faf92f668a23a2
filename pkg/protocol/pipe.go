package protocol

import (
	"net"
	"os"
)

// NewPipes returns a Server without a socket, never Served: its
// connections are the agent's ends of net.Pipe pairs that Pipe makes, for
// peers of the agent's own uid. It is for a simulation of a whole agent
// inside a testing/synctest bubble (pkg/supervisor/internal/agentsim),
// where a goroutine reading a real socket is not durably blocked and the
// bubble's clock could never run. Everything past the accept (hello and
// line timeouts, the buffer budget, the cap, Post's queue) is the real
// server's.
func NewPipes(cfg ServerConfig) *Server {
	cfg.defaults()
	return &Server{cfg: cfg, log: cfg.Log, selfID: os.Geteuid(), events: make(chan Event, EventBuffer),
		quit: make(chan struct{}), conns: make(map[uint64]*Conn)}
}

// Pipe connects a peer of process id pid and returns its end of the
// connection, served at once (connections made one after another get
// increasing ids, as accepted ones do). A connection over the cap is
// closed, its error line lost.
func (s *Server) Pipe(pid int) net.Conn {
	peer, agent := net.Pipe()
	s.serveConn(agent, peerCredentials{UID: s.selfID, PID: pid})
	return peer
}

// ClosePipes closes a Server of Pipes, waits for its connections' readers
// and senders, and closes Events, as Serve does once it returns.
func (s *Server) ClosePipes() {
	s.Close()
	s.readers.Wait()
	s.flushers.Wait()
	close(s.events)
}
