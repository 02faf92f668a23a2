package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

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
