package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// EventBuffer is the capacity of the channel returned by Server.Events.
const EventBuffer = 256

// DefaultWriteTimeout bounds one Conn.Send, so that a trainer that stops
// reading cannot block the agent.
const DefaultWriteTimeout = 5 * time.Second

// ServerConfig configures Listen.
type ServerConfig struct {
	Path         string        // socket path; its parent dir is created 0700 if missing
	Mode         os.FileMode   // socket file mode; default 0600
	AllowUIDs    []int         // peers allowed besides the agent's own uid and root
	WriteTimeout time.Duration // bound on one Send; default DefaultWriteTimeout
	Log          *zap.Logger   // nil: no logs
}

// Event is one message from a trainer, or the end of its connection
// (Msg.Type == TypeDisconnected, Err set when the end was not a clean EOF).
// Events of one connection arrive in order.
type Event struct {
	Conn *Conn
	Msg  Message
	Err  error
}

// Server accepts trainer connections on a Unix socket and turns their
// lines into Events. Listen, then Serve; the agent reads Events and answers
// with Conn.Send or Broadcast.
type Server struct {
	cfg    ServerConfig
	log    *zap.Logger
	ln     *net.UnixListener
	sockFI os.FileInfo // the socket file we created, so Close removes only that
	selfID int
	events chan Event

	quit      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	conns   map[uint64]*Conn
	nextID  uint64
	serving bool
	readers sync.WaitGroup
}

// Listen creates the socket, ready for Serve. A stale socket at cfg.Path is
// removed; anything else there is an error and is left alone.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Path == "" {
		return nil, errors.New("listen: empty socket path")
	}
	if cfg.Mode == 0 {
		cfg.Mode = 0o600
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o700); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if err := removeStaleSocket(cfg.Path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// Close removes the file itself, and only if it is still a socket.
	ln.SetUnlinkOnClose(false)
	// Connections made before the chmod are still subject to the uid check.
	if err := os.Chmod(cfg.Path, cfg.Mode); err != nil {
		ln.Close()
		os.Remove(cfg.Path)
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	fi, err := os.Lstat(cfg.Path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("stat socket: %w", err)
	}
	log.Info("socket listening", zap.String("path", cfg.Path),
		zap.String("mode", cfg.Mode.String()), zap.Ints("allow_uids", cfg.AllowUIDs))
	return &Server{
		cfg:    cfg,
		log:    log,
		ln:     ln,
		sockFI: fi,
		selfID: os.Geteuid(),
		events: make(chan Event, EventBuffer),
		quit:   make(chan struct{}),
		conns:  make(map[uint64]*Conn),
	}, nil
}

// removeStaleSocket removes path if it is a socket; a missing path is fine,
// any other kind of file is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket path: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("socket path %s exists and is not a socket (%s)", path, fi.Mode().Type())
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// Path is the socket path.
func (s *Server) Path() string { return s.cfg.Path }

// Events delivers trainer messages, then one TypeDisconnected event per
// connection. A reader blocks while the buffer is full (backpressure on that
// trainer only), except for progress, which is dropped instead. Once the
// server closes nothing more is delivered, and Events is closed when Serve
// returns.
func (s *Server) Events() <-chan Event { return s.events }

// Serve accepts connections until ctx ends or Close is called, then closes
// every connection, waits for their readers, removes the socket file and
// closes Events. It returns nil on such a shutdown.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("serve: already serving")
	}
	s.serving = true
	s.mu.Unlock()
	defer close(s.events)
	defer s.readers.Wait()
	defer s.Close()

	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()

	for {
		nc, err := s.ln.AcceptUnix()
		if err != nil {
			if s.closed() {
				return nil
			}
			// EMFILE and the like: back off instead of spinning.
			s.log.Warn("accept failed", zap.Error(err))
			select {
			case <-s.quit:
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.admit(nc)
	}
}

// admit checks the peer's credentials and starts serving the connection.
func (s *Server) admit(nc *net.UnixConn) {
	cred, err := peerCred(nc)
	if err != nil {
		s.log.Warn("connection refused: no peer credentials", zap.Error(err))
		nc.Close()
		return
	}
	if !uidAllowed(cred.UID, s.selfID, s.cfg.AllowUIDs) {
		s.log.Warn("connection refused: peer uid not allowed",
			zap.Int("uid", cred.UID), zap.Int("pid", cred.PID))
		nc.Close()
		return
	}
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.nextID++
	c := newConn(s, s.nextID, nc, cred)
	s.conns[c.id] = c
	s.readers.Add(1)
	s.mu.Unlock()
	c.log.Info("connection accepted")
	go func() {
		defer s.readers.Done()
		c.serve()
	}()
}

// uidAllowed is the peer uid policy: the agent's own uid, root, and the
// configured extra uids.
func uidAllowed(uid, self int, allow []int) bool {
	return uid == self || uid == 0 || slices.Contains(allow, uid)
}

func (s *Server) forget(c *Conn) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.mu.Unlock()
}

// emit delivers ev, blocking while the buffer is full (backpressure on the
// sender's connection). It gives up, returning false, once the server closes.
func (s *Server) emit(ev Event) bool {
	select {
	case s.events <- ev:
		return true
	case <-s.quit:
		return false
	}
}

// tryEmit delivers ev only if there is room right now.
func (s *Server) tryEmit(ev Event) bool {
	select {
	case s.events <- ev:
		return true
	default:
		return false
	}
}

// Conns returns the open connections, oldest first.
func (s *Server) Conns() []*Conn {
	s.mu.Lock()
	out := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		out = append(out, c)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Conn) int { return cmp.Compare(a.id, b.id) })
	return out
}

// Broadcast sends m to every connection that said hello, in parallel, and
// returns when each send has finished or timed out. Failures are logged and
// close the failing connection.
func (s *Server) Broadcast(m Message) {
	var wg sync.WaitGroup
	for _, c := range s.Conns() {
		if _, ok := c.Hello(); !ok {
			continue
		}
		wg.Go(func() { c.Send(m) })
	}
	wg.Wait()
}

// Close stops accepting, closes every connection and removes the socket
// file. Serve then returns. Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		close(s.quit)
		conns := make([]*Conn, 0, len(s.conns))
		for _, c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		s.closeErr = s.ln.Close()
		for _, c := range conns {
			c.Close()
		}
		// A newer agent may have replaced the socket: remove only ours.
		if fi, err := os.Lstat(s.cfg.Path); err == nil && os.SameFile(fi, s.sockFI) {
			os.Remove(s.cfg.Path)
		}
		s.log.Info("socket closed", zap.String("path", s.cfg.Path))
	})
	return s.closeErr
}

func (s *Server) closed() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}
