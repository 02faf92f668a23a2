package protocol

// Both ends of a connection: the agent's Conn (bounded lines, a queue
// written beside the loop, peer credentials) and the Go Client a trainer
// uses.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Why a connection ended, as Event.Err of its TypeDisconnected event.
var (
	// ErrLineTooLong: the trainer sent a line longer than maxLine. The
	// stream cannot be trusted past it, so the connection is closed.
	ErrLineTooLong = errors.New("line too long")
	// ErrConnClosed: the agent closed the connection (Close, or shutdown).
	ErrConnClosed = errors.New("connection closed")
	// ErrHelloTimeout: the connection said no hello and sent no line for
	// the server's HelloTimeout.
	ErrHelloTimeout = errors.New("no hello in time")
	// ErrLineTimeout: a started line was not finished within LineTimeout.
	ErrLineTimeout = errors.New("line not finished in time")
	// ErrBufferBudget: holding this connection's unfinished line would
	// exceed the bytes the server holds for all connections together.
	ErrBufferBudget = errors.New("line buffer budget exceeded")
)

// Conn is one trainer connection. Send is safe for concurrent use.
type Conn struct {
	srv   *Server
	id    uint64
	nc    net.Conn // a *net.UnixConn; a net.Pipe end for Pipes (pipe.go)
	cred  peerCredentials
	ident string // PeerIdentity
	log   *zap.Logger

	// wturn serialises writes: a channel, not a mutex, so that a Send
	// waiting behind one that blocks on a peer that does not read (up to
	// WriteTimeout) is durably blocked inside a synctest bubble (the
	// agent's simulation over net.Pipe, where a goroutine waiting on the
	// mutex stopped the bubble's clock, and with it the write's deadline).
	wturn chan struct{}

	mu       sync.Mutex
	hello    *Message
	cause    error // why the agent closed it; nil while open or closed by the peer
	outq     []queuedSend
	flushing bool

	closeOnce sync.Once
	closed    atomic.Bool
	dropped   atomic.Uint64 // progress messages dropped on a full Events buffer
}

func newConn(s *Server, id uint64, nc net.Conn, cred peerCredentials, ident string) *Conn {
	fields := []zap.Field{zap.Uint64("conn", id), zap.Int("uid", cred.UID), zap.Int("pid", cred.PID)}
	if ident != "" {
		fields = append(fields, zap.String("peer", ident))
	}
	return &Conn{
		srv:   s,
		id:    id,
		nc:    nc,
		cred:  cred,
		ident: ident,
		log:   s.log.With(fields...),
		wturn: make(chan struct{}, 1),
	}
}

// PeerIdentity names the peer for node mode's run binding: "pod:<uid>"
// or "uid:<uid>" (empty unless the server has IdentifyPeers set).
func (c *Conn) PeerIdentity() string { return c.ident }

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
	c.wturn <- struct{}{}
	defer func() { <-c.wturn }()
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

// maxQueued bounds the replies SendNoWait holds for one connection.
const maxQueued = 16

type queuedSend struct {
	m          Message
	closeAfter bool
}

// SendNoWait sends m in the background, in order with other SendNoWait
// calls, for a caller that must not wait on a peer (node mode's
// dispatcher). A peer with maxQueued replies still unsent is not reading
// them: it is closed instead. With closeAfter the connection is closed
// once m is sent.
func (c *Conn) SendNoWait(m Message, closeAfter bool) {
	c.mu.Lock()
	if len(c.outq) >= maxQueued {
		c.mu.Unlock()
		c.log.Warn("peer does not read its replies: closing the connection", zap.String("type", m.Type))
		c.closeWith(fmt.Errorf("send %s: peer does not read: %w", m.Type, ErrConnClosed))
		return
	}
	c.outq = append(c.outq, queuedSend{m, closeAfter})
	start := !c.flushing
	c.flushing = true
	c.mu.Unlock()
	if start {
		c.srv.flushers.Add(1) // Serve waits for them
		go func() {
			defer c.srv.flushers.Done()
			c.flush()
		}()
	}
}

// Post queues m for sending, as SendNoWait, and reports at once a
// connection that is already closed. The agent's loop sends only this
// way: a trainer that stops reading costs its own connection (closed once
// maxQueued messages wait), never the loop WriteTimeout per message.
func (c *Conn) Post(m Message) error {
	if c.closed.Load() {
		return fmt.Errorf("send %s: %w", m.Type, ErrConnClosed)
	}
	c.SendNoWait(m, false)
	return nil
}

// flush sends what SendNoWait queued until the queue is empty.
func (c *Conn) flush() {
	for {
		c.mu.Lock()
		if len(c.outq) == 0 {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		q := c.outq[0]
		c.outq = c.outq[1:]
		c.mu.Unlock()
		c.Send(q.m)
		if q.closeAfter {
			c.Close()
		}
	}
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

// readLoop handles complete lines until EOF, an error, an oversized line
// or a timeout. A trailing line without newline is discarded; its length
// is returned. A clean EOF returns a nil error.
//
// Before hello, a connection that sends no complete line for HelloTimeout
// is closed; after hello it may stay silent forever (trainers do). A
// started line must end within LineTimeout, and the bytes of unfinished
// lines are accounted against the server's MaxBuffered across all
// connections: a line that would exceed it closes its connection.
func (c *Conn) readLoop() (int, error) {
	cfg := &c.srv.cfg
	buf := make([]byte, 16<<10)
	var (
		pending   []byte // the unfinished line, accounted in srv.buffered
		lineStart time.Time
		lastLine  = time.Now()
	)
	defer func() { c.srv.release(len(pending)) }()
	for {
		var dl time.Time
		if _, ok := c.Hello(); !ok {
			dl = lastLine.Add(cfg.HelloTimeout)
		}
		if len(pending) > 0 {
			if ld := lineStart.Add(cfg.LineTimeout); dl.IsZero() || ld.Before(dl) {
				dl = ld
			}
		}
		c.nc.SetReadDeadline(dl)
		n, err := c.nc.Read(buf)
		data := buf[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			seg := data
			if i >= 0 {
				seg = data[:i+1]
			}
			data = data[len(seg):]
			if len(pending)+len(seg) > maxLine {
				c.replyError("", fmt.Sprintf("line exceeds %d bytes; closing connection", maxLine))
				c.closeWith(ErrLineTooLong)
				return 0, ErrLineTooLong
			}
			if i < 0 {
				if !c.srv.reserve(len(seg)) {
					c.log.Warn("line buffer budget exceeded: closing the connection",
						zap.Int("partial_bytes", len(pending)+len(seg)), zap.Int64("buffered_bytes", c.srv.Buffered()),
						zap.Int64("max_buffered", cfg.MaxBuffered))
					c.replyError("", fmt.Sprintf("agent is holding too many unfinished lines (%d bytes): closing connection", cfg.MaxBuffered))
					c.closeWith(ErrBufferBudget)
					return 0, ErrBufferBudget
				}
				if len(pending) == 0 {
					lineStart = time.Now()
				}
				pending = append(pending, seg...)
				break
			}
			line := seg
			if len(pending) > 0 {
				line = append(pending, seg...)
			}
			ok := c.handle(line)
			c.srv.release(len(pending))
			pending = pending[:0]
			if cap(pending) > 64<<10 {
				pending = nil // do not keep a megabyte per idle connection
			}
			lastLine = time.Now()
			if !ok {
				return 0, nil
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				return len(pending), nil
			case errors.Is(err, os.ErrDeadlineExceeded) && len(pending) > 0:
				c.replyError("", fmt.Sprintf("line not finished within %s; closing connection", cfg.LineTimeout))
				c.closeWith(ErrLineTimeout)
				return 0, ErrLineTimeout
			case errors.Is(err, os.ErrDeadlineExceeded):
				c.replyError("", fmt.Sprintf("no hello within %s; closing connection", cfg.HelloTimeout))
				c.closeWith(ErrHelloTimeout)
				return 0, ErrHelloTimeout
			}
			return len(pending), err
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
	if err := m.validate(); err != nil {
		// Refused where it enters: nothing behind the socket sees it (a
		// refused hello leaves the connection without one).
		c.log.Debug("message refused", zap.String("type", m.Type), zap.Error(err))
		c.replyError(m.ID, err.Error())
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
	case TypeDone, TypeSaved, TypeFailed, TypeStatus, TypeJoin, TypeBye:
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

// ErrBadMessage reports a line from the agent that is not a protocol
// message (not JSON). The connection is still usable: Recv again.
var ErrBadMessage = errors.New("bad message")

// Client is one connection to an agent's socket, speaking protocol v1: the
// Go counterpart of the Python client, used by `spotagent status`, the
// signal bridge, the bench and the tests. Send and Recv may be called from
// different goroutines; each of them from one goroutine at a time.
type Client struct {
	nc   *net.UnixConn
	r    *bufio.Reader
	path string
	wmu  sync.Mutex
}

// Dial connects to the agent's socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("no agent listening at %s", path)
		}
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return &Client{nc: nc.(*net.UnixConn), r: bufio.NewReaderSize(nc, 64<<10), path: path}, nil
}

// Close closes the connection; a Recv blocked in another goroutine returns.
func (c *Client) Close() error { return c.nc.Close() }

// bound applies ctx's deadline and cancellation to one I/O call through
// set (SetReadDeadline or SetWriteDeadline); the returned func undoes it.
func bound(ctx context.Context, set func(time.Time) error) func() {
	dl, _ := ctx.Deadline() // zero: none
	set(dl)
	stop := context.AfterFunc(ctx, func() { set(time.Now()) })
	return func() { stop() }
}

// Send writes m as one line.
func (c *Client) Send(ctx context.Context, m Message) error {
	b, err := encodeLine(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.Type, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer bound(ctx, c.nc.SetWriteDeadline)()
	if _, err := c.nc.Write(b); err != nil {
		return fmt.Errorf("send %s: %w", m.Type, ctxErr(ctx, err))
	}
	return nil
}

// Recv reads the next message. A line longer than maxLine ends the
// connection's usefulness (ErrLineTooLong); one that is not JSON is
// ErrBadMessage; the agent closing the connection is io.EOF.
func (c *Client) Recv(ctx context.Context) (Message, error) {
	defer bound(ctx, c.nc.SetReadDeadline)()
	line, err := c.readLine()
	if err != nil {
		return Message{}, ctxErr(ctx, err)
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	return m, nil
}

// readLine reads one line, newline included, of at most maxLine bytes.
// A line is too long as soon as maxLine bytes came without a newline.
func (c *Client) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := c.r.ReadSlice('\n')
		line = append(line, frag...)
		switch {
		case len(line) > maxLine, errors.Is(err, bufio.ErrBufferFull) && len(line) >= maxLine:
			return nil, ErrLineTooLong
		case err == nil:
			return line, nil
		case !errors.Is(err, bufio.ErrBufferFull):
			return nil, err // io.EOF also after a partial line
		}
	}
}

// ctxErr reports ctx's error for an I/O error that ctx caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return ctx.Err()
	}
	return err
}

// Hello sends hello (its Type is set here) and returns the agent's
// welcome; an error reply is returned as an error.
func (c *Client) Hello(ctx context.Context, hello Message) (Message, error) {
	hello.Type = TypeHello
	if err := c.Send(ctx, hello); err != nil {
		return Message{}, err
	}
	for {
		m, err := c.Recv(ctx)
		if errors.Is(err, ErrBadMessage) {
			continue
		}
		if err != nil {
			return Message{}, fmt.Errorf("hello: %w", err)
		}
		switch m.Type {
		case TypeWelcome:
			return m, nil
		case TypeError:
			return Message{}, fmt.Errorf("hello: agent: %s", m.Error)
		}
	}
}

// Status asks the agent for its status and returns the status object of
// the reply. No hello is needed; should an agent refuse the request with
// an error, it says hello and asks once more. Messages meant for a
// trainer that arrive meanwhile are skipped.
func (c *Client) Status(ctx context.Context) (json.RawMessage, error) {
	if err := c.Send(ctx, Message{Type: TypeStatus}); err != nil {
		return nil, err
	}
	retried := false
	for {
		m, err := c.Recv(ctx)
		switch {
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("agent at %s closed the connection without a status reply", c.path)
		case errors.Is(err, ErrBadMessage):
			return nil, fmt.Errorf("decode reply: %w", err)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("no status reply from %s: %w", c.path, ctx.Err())
		case err != nil:
			return nil, fmt.Errorf("read reply: %w", err)
		}
		switch m.Type {
		case TypeStatus:
			if len(m.Status) == 0 {
				return nil, errors.New("status reply without status")
			}
			return m.Status, nil
		case TypeError:
			if retried {
				return nil, fmt.Errorf("agent: %s", m.Error)
			}
			retried = true
			if err := c.Send(ctx, Message{Type: TypeHello, PID: os.Getpid()}); err != nil {
				return nil, err
			}
			if err := c.Send(ctx, Message{Type: TypeStatus}); err != nil {
				return nil, err
			}
		}
		// Anything else (a welcome after the hello) is not ours to handle.
	}
}
