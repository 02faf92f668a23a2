package protocol

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
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/pathtrust"
)

// EventBuffer is the capacity of the channel returned by Server.Events.
const EventBuffer = 256

// defaultWriteTimeout bounds one Conn.Send, so that a trainer that stops
// reading cannot block the agent.
const defaultWriteTimeout = 5 * time.Second

// Limits on what connections may hold, so that a hostile local process
// cannot exhaust the agent's file descriptors or memory.
const (
	// DefaultMaxConns is the connection cap of a run or sidecar agent.
	DefaultMaxConns = 64
	// DefaultNodeMaxConns is the connection cap of a node agent.
	DefaultNodeMaxConns = 256
	// defaultHelloTimeout closes a connection that has not said hello
	// and sent no complete line for this long. After hello a trainer may
	// stay silent for as long as it likes.
	defaultHelloTimeout = 30 * time.Second
	// defaultLineTimeout closes a connection whose started line is not
	// finished within this.
	defaultLineTimeout = 10 * time.Second
	// defaultMaxBuffered bounds the bytes of unfinished lines held
	// across all connections.
	defaultMaxBuffered = 16 << 20
	// defaultSocketCheck is how often the socket file is checked to still
	// be the one the agent created.
	defaultSocketCheck = 5 * time.Second
)

// ServerConfig configures Listen.
type ServerConfig struct {
	Path string // socket path; its parent dir is created 0700 if missing
	// PrivateDir marks Path's directory as the agent's own, as the
	// default socket location is: it is created 0700 if missing and
	// refused unless it is a real directory (not a symlink) owned by the
	// agent's euid with no group or other permission bits. A configured
	// path (a Kubernetes emptyDir, a hostPath) cannot be held to that:
	// there a symlinked directory is refused and a directory other users
	// may write to draws a warning.
	PrivateDir   bool
	Mode         os.FileMode   // socket file mode; default 0600
	AllowUIDs    []int         // peers allowed besides the agent's own uid and root
	WriteTimeout time.Duration // bound on one Send; default defaultWriteTimeout
	// MaxConns caps open connections (default DefaultMaxConns); further
	// ones are refused with an error line. It is lowered to a quarter of
	// the file descriptor limit, so that commits keep the rest.
	MaxConns     int
	HelloTimeout time.Duration // default defaultHelloTimeout
	LineTimeout  time.Duration // default defaultLineTimeout
	MaxBuffered  int64         // default defaultMaxBuffered
	SocketCheck  time.Duration // default defaultSocketCheck
	// IdentifyPeers reads each peer's pod (from its cgroup) or else its
	// uid at accept time, for Conn.PeerIdentity (node mode).
	IdentifyPeers bool
	Log           *zap.Logger // nil: no logs

	// Identify, when set, names each peer in place of its pod or uid
	// (peerIdentity): tests play several pods from one process.
	Identify func(uid, pid int) string
}

func (c *ServerConfig) defaults() {
	if c.Mode == 0 {
		c.Mode = 0o600
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = defaultWriteTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = defaultHelloTimeout
	}
	if c.LineTimeout <= 0 {
		c.LineTimeout = defaultLineTimeout
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = defaultMaxBuffered
	}
	if c.SocketCheck <= 0 {
		c.SocketCheck = defaultSocketCheck
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.Identify == nil && c.IdentifyPeers {
		c.Identify = func(uid, pid int) string { return peerIdentity(peerCredentials{UID: uid, PID: pid}) }
	}
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
	selfID int
	events chan Event

	quit      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error

	buffered atomic.Int64 // bytes of unfinished lines, all connections

	refusedMu     sync.Mutex
	refused       int // connections refused at the cap since the last log line
	refusedLogged time.Time

	mu       sync.Mutex
	ln       *net.UnixListener
	sockFI   os.FileInfo // the socket file we created, so Close removes only that
	conns    map[uint64]*Conn
	nextID   uint64
	serving  bool
	readers  sync.WaitGroup
	flushers sync.WaitGroup // SendNoWait senders
}

// Listen creates the socket, ready for Serve. A stale socket at cfg.Path is
// removed; anything else there is an error and is left alone.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Path == "" {
		return nil, errors.New("listen: empty socket path")
	}
	cfg.defaults()
	log := cfg.Log
	if err := prepareSocketDir(filepath.Dir(cfg.Path), cfg.PrivateDir, log); err != nil {
		return nil, err
	}
	if max := connLimit(cfg.MaxConns); max < cfg.MaxConns {
		log.Warn("connection cap lowered to a quarter of the file descriptor limit",
			zap.Int("max_connections", max), zap.Int("configured", cfg.MaxConns))
		cfg.MaxConns = max
	}
	ln, fi, err := bindSocket(cfg.Path, cfg.Mode)
	if err != nil {
		return nil, err
	}
	log.Info("socket listening", zap.String("path", cfg.Path),
		zap.String("mode", cfg.Mode.String()), zap.Ints("allow_uids", cfg.AllowUIDs),
		zap.Int("max_connections", cfg.MaxConns))
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

// bindSocket creates the socket file at path with mode and returns the
// listener and the file's identity.
func bindSocket(path string, mode os.FileMode) (*net.UnixListener, os.FileInfo, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	// Close removes the file itself, and only if it is still a socket.
	ln.SetUnlinkOnClose(false)
	// Connections made before the chmod are still subject to the uid check.
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		os.Remove(path)
		return nil, nil, fmt.Errorf("chmod socket: %w", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("stat socket: %w", err)
	}
	return ln, fi, nil
}

// prepareSocketDir makes sure the socket's directory exists and cannot be
// used to hand trainers someone else's socket. A private directory (the
// default location) must be the agent's own: created 0700, or else refused
// unless owned by the agent's euid, not a symlink, with no group or other
// bits, below directories others cannot rename it in (pathtrust.Walk:
// the parent and every one above it). A configured directory is
// the operator's choice (an emptyDir is 0777 by design): only a symlink is
// refused there, and a directory other users may write to is logged.
func prepareSocketDir(dir string, private bool, log *zap.Logger) error {
	euid := os.Geteuid()
	if !private {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create socket dir: %w", err)
		}
		fi, err := os.Lstat(dir)
		if err != nil {
			return fmt.Errorf("socket dir: %w", err)
		}
		if fi.Mode().Type() == fs.ModeSymlink {
			return fmt.Errorf("socket dir %s is a symlink: refusing it; use the directory it points to", dir)
		}
		if !fi.IsDir() {
			return fmt.Errorf("socket dir %s is not a directory", dir)
		}
		if why := othersCanReplace(fi, euid); why != "" {
			log.Warn("socket dir: other users can replace the socket; trainers must check the agent's uid (the Python client does), and the agent re-creates its socket if it is replaced",
				zap.String("dir", dir), zap.String("why", why))
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("create socket dir: %w", err)
	}
	// Every directory on the way, the parent and those above it (from an
	// absolute path: the default's TMPDIR may be relative).
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	_, bad, err := pathtrust.Walk(abs, pathtrust.Trusted)
	if err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("socket dir %s: %v: another user could replace it: refusing it (pass --socket)", dir, bad[0])
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create socket dir: %w", err)
	}
	// Checked after Mkdir, whoever created it: never chmod a foreign dir.
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	switch owner, ok := fileOwner(fi); {
	case fi.Mode().Type() == fs.ModeSymlink:
		return fmt.Errorf("socket dir %s is a symlink: refusing it (remove it, or pass --socket)", dir)
	case !fi.IsDir():
		return fmt.Errorf("socket dir %s is not a directory (%s): refusing it (remove it, or pass --socket)", dir, fi.Mode().Type())
	case !ok || owner != euid:
		return fmt.Errorf("socket dir %s is owned by uid %d, not %d (this agent): refusing it (remove it, or pass --socket)", dir, owner, euid)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("socket dir %s has mode %s, want no group or other permissions (chmod 0700 it, or pass --socket)", dir, fi.Mode().Perm())
	}
	return nil
}

// othersCanReplace says why users other than euid could replace a file in
// the directory fi describes, or "" if they cannot.
func othersCanReplace(fi os.FileInfo, euid int) string {
	if owner, ok := fileOwner(fi); ok && owner != euid && owner != 0 {
		return fmt.Sprintf("owned by uid %d", owner)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Sprintf("mode %s: writable by group or others", fi.Mode().Perm())
	}
	return ""
}

// connLimit is the connection cap for configured max: at most a quarter
// of the open file limit, so that commits and uploads keep theirs.
func connLimit(want int) int {
	if n := fdLimit(); n > 0 {
		return min(want, max(1, n/4))
	}
	return want
}

// CheckStart checks, without binding, what Listen would refuse: the
// socket directory (its owner, mode and parent, as Listen checks them) and
// a live agent already serving cfg.Path (ErrSocketInUse). An agent calls
// it before it touches its store: a start refused after its lease was
// taken would fence the live agent's run (review, item 1). Listen checks
// again: this is no lock, only the refusals an operator can cause.
func CheckStart(cfg ServerConfig) error {
	if cfg.Path == "" {
		return errors.New("listen: empty socket path")
	}
	// Listen logs what it finds; this check stays quiet.
	if err := prepareSocketDir(filepath.Dir(cfg.Path), cfg.PrivateDir, zap.NewNop()); err != nil {
		return err
	}
	return CheckFree(cfg.Path)
}

// ErrSocketInUse: the socket path is served by a live agent (a connect
// succeeded); a socket file nobody answers on is stale and replaced.
var ErrSocketInUse = errors.New("in use by another live agent")

// CheckFree returns ErrSocketInUse when something answers at path: another
// agent serves this socket, and binding over it would silently take its
// trainers (two runs, one socket). An agent checks before it touches its
// store (a lease would fence the other agent's run), and Listen again.
func CheckFree(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil // nothing there, or a stale file: Listen replaces it
	}
	c.Close()
	return fmt.Errorf("socket %s: %w", path, ErrSocketInUse)
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
	if err := CheckFree(path); err != nil {
		return err
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
// closes Events. It returns nil on such a shutdown. Meanwhile it checks
// every SocketCheck that the socket file is still the one it created.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("serve: already serving")
	}
	s.serving = true
	ln := s.ln
	s.mu.Unlock()
	defer close(s.events)
	defer s.flushers.Wait()
	defer s.readers.Wait()
	defer s.Close()

	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()

	var accepting sync.WaitGroup
	defer accepting.Wait()
	accepting.Go(func() { s.acceptLoop(ln) })
	tick := time.NewTicker(s.cfg.SocketCheck)
	defer tick.Stop()
	for {
		select {
		case <-s.quit:
			return nil
		case <-tick.C:
			if ln := s.checkSocket(); ln != nil {
				accepting.Go(func() { s.acceptLoop(ln) })
			}
		}
	}
}

// acceptLoop accepts on ln until it is closed.
func (s *Server) acceptLoop(ln *net.UnixListener) {
	for {
		nc, err := ln.AcceptUnix()
		if err != nil {
			if s.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: back off instead of spinning.
			s.log.Warn("accept failed", zap.Error(err))
			select {
			case <-s.quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.admit(nc)
	}
}

// checkSocket makes sure the socket file is still ours. Removed, or
// replaced by another user's socket (someone who can write to the
// directory), it is created anew and the new listener returned. A socket
// of the agent's own uid in its place is a newer agent: left alone.
func (s *Server) checkSocket() *net.UnixListener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sockFI == nil || s.closed() {
		return nil
	}
	path := s.cfg.Path
	fi, err := os.Lstat(path)
	if err == nil && os.SameFile(fi, s.sockFI) {
		return nil
	}
	if err == nil && fi.Mode().Type() == fs.ModeSocket {
		if owner, ok := fileOwner(fi); ok && owner == s.selfID {
			s.log.Warn("socket file replaced by another socket of this user (a newer agent?): no longer reachable at its path",
				zap.String("path", path))
			s.sockFI = nil // stop checking; Close leaves it alone
			return nil
		}
	}
	what := "removed"
	if err == nil {
		owner, _ := fileOwner(fi)
		what = fmt.Sprintf("replaced by a %s of uid %d", fileKind(fi), owner)
		if fi.Mode().Type() != fs.ModeSocket && fi.Mode().Type() != fs.ModeSymlink {
			s.log.Error("socket file "+what+": trainers cannot reach the agent; not touching it",
				zap.String("path", path))
			s.sockFI = nil
			return nil
		}
		if err := os.Remove(path); err != nil {
			s.log.Error("socket file "+what+": could not remove it", zap.String("path", path), zap.Error(err))
			return nil
		}
	}
	ln, nfi, err := bindSocket(path, s.cfg.Mode)
	if err != nil {
		s.log.Error("socket file "+what+": could not re-create it", zap.String("path", path), zap.Error(err))
		return nil
	}
	s.log.Error("socket file "+what+": re-created it; connections made meanwhile did not reach this agent",
		zap.String("path", path))
	old := s.ln
	s.ln, s.sockFI = ln, nfi
	old.Close() // nobody can reach it any more: its file is gone
	return ln
}

func fileKind(fi os.FileInfo) string {
	switch fi.Mode().Type() {
	case fs.ModeSocket:
		return "socket"
	case fs.ModeSymlink:
		return "symlink"
	case fs.ModeDir:
		return "directory"
	case 0:
		return "regular file"
	}
	return fi.Mode().Type().String()
}

// admit checks the peer's credentials and the connection cap, and starts
// serving the connection.
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
	s.serveConn(nc, cred)
}

// serveConn serves connection nc of a peer with cred, within the cap.
func (s *Server) serveConn(nc net.Conn, cred peerCredentials) {
	var ident string
	if s.cfg.Identify != nil {
		ident = s.cfg.Identify(cred.UID, cred.PID)
	}
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		s.refuseOverCap(nc, cred)
		return
	}
	s.nextID++
	c := newConn(s, s.nextID, nc, cred, ident)
	s.conns[c.id] = c
	s.readers.Add(1)
	s.mu.Unlock()
	// Debug: a trainer's connection is logged once, as its hello is
	// welcomed ("trainer connected"); a status call once, as it closes.
	c.log.Debug("connection accepted")
	go func() {
		defer s.readers.Done()
		c.serve()
	}()
}

// refuseOverCap answers a connection beyond MaxConns with an error line
// and closes it. The log line is rate-limited: a flood logs once a second.
func (s *Server) refuseOverCap(nc net.Conn, cred peerCredentials) {
	if b, err := encodeLine(Message{Type: TypeError, Error: fmt.Sprintf("too many connections (%d): closing; try again later", s.cfg.MaxConns)}); err == nil {
		nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		nc.Write(b)
	}
	nc.Close()
	s.refusedMu.Lock()
	s.refused++
	n := s.refused
	log := time.Since(s.refusedLogged) >= time.Second
	if log {
		s.refused, s.refusedLogged = 0, time.Now()
	}
	s.refusedMu.Unlock()
	if log {
		s.log.Warn("connection refused: too many connections", zap.Int("max_connections", s.cfg.MaxConns),
			zap.Int("refused", n), zap.Int("uid", cred.UID), zap.Int("pid", cred.PID))
	}
}

// reserve accounts n more bytes of unfinished lines, unless that would
// exceed MaxBuffered.
func (s *Server) reserve(n int) bool {
	for {
		cur := s.buffered.Load()
		if cur+int64(n) > s.cfg.MaxBuffered {
			return false
		}
		if s.buffered.CompareAndSwap(cur, cur+int64(n)) {
			return true
		}
	}
}

func (s *Server) release(n int) { s.buffered.Add(-int64(n)) }

// Buffered is the number of bytes of unfinished lines the server holds.
func (s *Server) Buffered() int64 { return s.buffered.Load() }

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
		ln, sockFI := s.ln, s.sockFI
		s.mu.Unlock()
		if ln != nil { // nil: a Server of Pipes (pipe.go)
			s.closeErr = ln.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		// A newer agent may have replaced the socket: remove only ours.
		if fi, err := os.Lstat(s.cfg.Path); err == nil && sockFI != nil && os.SameFile(fi, sockFI) {
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
