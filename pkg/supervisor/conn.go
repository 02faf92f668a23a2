package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Why a connection ended, as Event.Err of its TypeDisconnected event.
var (
	// ErrLineTooLong: the trainer sent a line longer than MaxLine. The
	// stream cannot be trusted past it, so the connection is closed.
	ErrLineTooLong = errors.New("line too long")
	// ErrConnClosed: the agent closed the connection (Close, or shutdown).
	ErrConnClosed = errors.New("connection closed")
)

// Conn is one trainer connection. Send is safe for concurrent use.
type Conn struct {
	srv  *Server
	id   uint64
	nc   *net.UnixConn
	cred peerCredentials
	log  *zap.Logger

	wmu sync.Mutex // serialises writes

	mu    sync.Mutex
	hello *Message
	cause error // why the agent closed it; nil while open or closed by the peer

	closeOnce sync.Once
	closed    atomic.Bool
	dropped   atomic.Uint64 // progress messages dropped on a full Events buffer
}

func newConn(s *Server, id uint64, nc *net.UnixConn, cred peerCredentials) *Conn {
	return &Conn{
		srv:  s,
		id:   id,
		nc:   nc,
		cred: cred,
		log:  s.log.With(zap.Uint64("conn", id), zap.Int("uid", cred.UID), zap.Int("pid", cred.PID)),
	}
}

// ID is unique among the connections of one Server, increasing.
func (c *Conn) ID() uint64 { return c.id }

// PeerUID is the peer's uid at connect time (SO_PEERCRED).
func (c *Conn) PeerUID() int { return c.cred.UID }

// PeerPID is the peer's pid at connect time (SO_PEERCRED).
func (c *Conn) PeerPID() int { return c.cred.PID }

// Hello returns the last hello the trainer sent, if any.
func (c *Conn) Hello() (Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hello == nil {
		return Message{}, false
	}
	return *c.hello, true
}

// DroppedProgress counts progress messages dropped because Events was full.
func (c *Conn) DroppedProgress() uint64 { return c.dropped.Load() }

// Send writes m as one line. A write that does not finish within the
// server's write timeout fails, and a failed write closes the connection.
func (c *Conn) Send(m Message) error {
	b, err := encodeLine(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.Type, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("send %s: %w", m.Type, ErrConnClosed)
	}
	err = c.nc.SetWriteDeadline(time.Now().Add(c.srv.cfg.WriteTimeout))
	if err == nil {
		_, err = c.nc.Write(b)
	}
	if err != nil {
		err = fmt.Errorf("send %s: %w", m.Type, err)
		c.closeWith(err)
		return err
	}
	return nil
}

// Close closes the connection; its reader then emits TypeDisconnected.
func (c *Conn) Close() error {
	return c.closeWith(ErrConnClosed)
}

func (c *Conn) closeWith(cause error) error {
	var err error
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.cause = cause
		c.mu.Unlock()
		c.closed.Store(true)
		err = c.nc.Close()
	})
	return err
}

// serve reads until the connection ends, then reports it: one log line and
// one TypeDisconnected event.
func (c *Conn) serve() {
	partial, err := c.readLoop()
	c.closeWith(nil)
	c.srv.forget(c)
	c.mu.Lock()
	if c.cause != nil {
		err = c.cause
	}
	c.mu.Unlock()
	fields := []zap.Field{zap.Uint64("dropped_progress", c.dropped.Load())}
	if h, ok := c.Hello(); ok && h.Rank != nil {
		fields = append(fields, zap.Int("rank", *h.Rank))
	}
	switch {
	case err != nil:
		c.log.Warn("connection closed", append(fields, zap.Error(err))...)
	case partial > 0:
		c.log.Warn("connection closed by peer mid-line; partial line discarded",
			append(fields, zap.Int("partial_bytes", partial))...)
	default:
		c.log.Info("connection closed by peer", fields...)
	}
	c.srv.emit(Event{Conn: c, Msg: Message{Type: TypeDisconnected}, Err: err})
}

// readLoop handles complete lines until EOF, an error or an oversized line.
// A trailing line without newline is discarded; its length is returned.
// A clean EOF returns a nil error.
func (c *Conn) readLoop() (int, error) {
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > MaxLine {
			c.replyError("", fmt.Sprintf("line exceeds %d bytes; closing connection", MaxLine))
			c.closeWith(ErrLineTooLong)
			return 0, ErrLineTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, frag...)
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return len(line) + len(frag), err
		}
		if len(line) > 0 {
			frag = append(line, frag...)
		}
		if !c.handle(frag) {
			return 0, nil
		}
		line = line[:0]
		if cap(line) > 64<<10 {
			line = nil // do not keep a megabyte per idle connection
		}
	}
}

// handle decodes one line and delivers it. It returns false once the server
// is shutting down.
func (c *Conn) handle(b []byte) bool {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return true
	}
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		c.log.Debug("malformed line", zap.Error(err))
		c.replyError("", "malformed json: "+err.Error())
		return true
	}
	switch m.Type {
	case TypeHello:
		c.mu.Lock()
		c.hello = &m
		c.mu.Unlock()
	case TypeProgress:
		// Progress is advisory and the next one supersedes it: rather than
		// block a trainer's reader on a full buffer, drop it.
		if !c.srv.tryEmit(Event{Conn: c, Msg: m}) {
			c.dropped.Add(1)
		}
		return true
	case TypeDone, TypeFailed, TypeStatus:
	case "":
		c.replyError(m.ID, "missing type")
		return true
	default:
		c.log.Debug("unknown message type", zap.String("type", m.Type))
		c.replyError(m.ID, fmt.Sprintf("unknown message type %q", m.Type))
		return true
	}
	return c.srv.emit(Event{Conn: c, Msg: m})
}

func (c *Conn) replyError(id, text string) {
	// A failed reply closes the connection; the read loop then ends.
	c.Send(Message{Type: TypeError, ID: id, Error: text})
}
