package peertier

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/connlimit"
)

// The bounds of a peer listener (its own or node mode's shared one), so
// that a flood of connections never takes the agent's descriptors, its
// memory or its trainers' socket (issue 46: 20,000 unauthenticated
// keep-alive connections took every fd of the agent, and 7,545 in 3.8 s
// its 256 MiB). Every request is authenticated before anything is held
// for it beyond its connection (no file opened, no disk read, no
// goroutine); only an authenticated one may keep its connection open.
const (
	// maxConns bounds the connections held at once: one descriptor and
	// at most connMemory each. Past it, new ones wait in the kernel's
	// accept queue (netutil.LimitListener), not in the agent.
	maxConns = 512
	// maxConnsPerSource bounds those of one source address (every
	// loopback address one: connlimit.Source): more are closed
	// as they are accepted, so that one machine cannot hold the whole of
	// maxConns. A restoring node opens at most maxServing to a peer; node
	// mode's runs on one machine share its IP.
	maxConnsPerSource = 64
	// perRunConns bounds the connections one run's authenticated
	// requests keep open (node mode's shared listener serves several):
	// past it they are answered, then closed.
	perRunConns = 128
	// maxConnRequests and maxConnAge bound a kept-alive connection: the
	// answer to the request past either closes it.
	maxConnRequests = 256
	maxConnAge      = 5 * time.Minute
	// readHeaderTimeout bounds the wait for a request's header (a
	// slow-request flood holds a connection this long at most); an idle
	// kept-alive connection is closed after idleTimeout (a client's own
	// idle bound is 30 s: NewClient).
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = time.Minute
	// maxHeaderBytes bounds a request's line and header (net/http allows
	// 4 KiB more of buffering); a request of the peer tier is under 1 KiB.
	maxHeaderBytes = 8 << 10
)

// connMemory is what one connection costs the agent at most, measured
// (TestListenerBounds: heap per held connection) and rounded up: the
// goroutine, net/http's buffers and a header of maxHeaderBytes.
const connMemory = 64 << 10

// newHTTPServer is the peer tier's http.Server for handler h, with the
// bounds above (boundedListener does the connection caps), a request's
// header waited for at most header.
func newHTTPServer(h http.Handler, header time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: header, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if bc, ok := c.(*boundedConn); ok {
				return context.WithValue(ctx, connKey{}, bc)
			}
			return ctx
		},
		ErrorLog: discardLog}
}

// limits are a peer listener's connection caps (internal/connlimit).
var limits = connlimit.Limits{Max: maxConns, PerSource: maxConnsPerSource, Wait: true, Name: "peer tier"}

// boundedListener is a TCP listener with the caps above: maxConns and
// maxConnsPerSource (connlimit: closed at accept past the source's cap,
// left in the kernel's queue past maxConns), and the per-run share of
// kept-alive connections.
type boundedListener struct {
	*connlimit.Listener

	mu    sync.Mutex
	byRun map[string]int // kept-alive connections bound to a run, by route key
}

// bound caps ln: its connections, and theirs per source and per run.
func bound(ln net.Listener, log *zap.Logger) *boundedListener {
	return boundWithin(ln, limits, log)
}

// boundWithin caps ln by lim (tests stand for several machines with a
// lim.Source of their own), and per run.
func boundWithin(ln net.Listener, lim connlimit.Limits, log *zap.Logger) *boundedListener {
	return &boundedListener{Listener: connlimit.New(ln, lim, log), byRun: map[string]int{}}
}

// Accept returns the next connection within the caps.
func (l *boundedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &boundedConn{Conn: c, l: l, opened: time.Now()}, nil
}

// giveRun uncounts a kept-alive connection of run.
func (l *boundedListener) giveRun(run string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byRun[run]--; l.byRun[run] <= 0 {
		delete(l.byRun, run)
	}
}

// bindRun counts one more kept-alive connection for run, if within its share.
func (l *boundedListener) bindRun(run string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byRun[run] >= perRunConns {
		return false
	}
	l.byRun[run]++
	return true
}

type connKey struct{}

// boundedConn is one connection of a boundedListener.
type boundedConn struct {
	net.Conn // a connlimit.Conn, uncounted as it closes
	l        *boundedListener
	opened   time.Time

	requests int // answered on it; only its serving goroutine touches it

	mu     sync.Mutex
	run    string // the run its kept-alive requests are for; "": none yet
	closed bool
}

// keep reports whether the connection may stay open after an
// authenticated request for run (route key): within maxConnRequests,
// maxConnAge and the run's share. A connection is bound to the first run
// it is kept for; a request for another closes it.
func (c *boundedConn) keep(run string) bool {
	c.requests++
	if c.requests >= maxConnRequests || time.Since(c.opened) >= maxConnAge {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return false
	case c.run != "":
		return c.run == run
	case !c.l.bindRun(run):
		return false
	}
	c.run = run
	return true
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		if c.run != "" {
			c.l.giveRun(c.run)
		}
	}
	return err
}

// keepAlive lets r's connection stay open after an authenticated request
// for run if within its bounds (boundedConn.keep), else closes it after
// the answer.
func keepAlive(w http.ResponseWriter, r *http.Request, run string) {
	if c, ok := r.Context().Value(connKey{}).(*boundedConn); !ok || !c.keep(run) {
		w.Header().Set("Connection", "close")
	}
}
