package peertier

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/netutil"
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
	// maxConnsPerSource bounds those of one source address (one IPv6
	// /64): more are closed as they are accepted, so that one machine
	// cannot hold the whole of maxConns. A restoring node opens at most
	// maxServing to a peer; node mode's runs on one machine share its IP.
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

// boundedListener is a TCP listener with the caps above: maxConns (by
// netutil.LimitListener), maxConnsPerSource (closed at accept), and the
// per-run share of kept-alive connections.
type boundedListener struct {
	net.Listener // the LimitListener
	warn         *warnings

	mu       sync.Mutex
	held     int                // connections held
	bySource map[netip.Addr]int // connections held, by source
	byRun    map[string]int     // kept-alive connections bound to a run, by route key
}

// bound caps ln: its connections, and theirs per source and per run.
func bound(ln net.Listener, log *zap.Logger) *boundedListener {
	return &boundedListener{Listener: netutil.LimitListener(ln, maxConns), warn: newWarnings(log),
		bySource: map[netip.Addr]int{}, byRun: map[string]int{}}
}

// Accept returns the next connection within the caps; one over its
// source's cap is closed at once (and counted in a warning).
func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		held, ok := l.take(src)
		if !ok {
			c.Close()
			l.warn.note("peer tier: connections over the per-source cap closed", zap.String("source", src.String()), zap.Int("cap", maxConnsPerSource))
			continue
		}
		if held == maxConns {
			l.warn.note("peer tier: at the connection cap: new connections wait in the kernel's queue", zap.Int("cap", maxConns))
		}
		return &boundedConn{Conn: c, l: l, src: src, opened: time.Now()}, nil
	}
}

// take counts a connection from src, unless src holds its cap already.
func (l *boundedListener) take(src netip.Addr) (held int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= maxConnsPerSource {
		return l.held, false
	}
	l.bySource[src]++
	l.held++
	return l.held, true
}

// give uncounts a connection from src, and its run's, if bound to one.
func (l *boundedListener) give(src netip.Addr, run string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
	if run == "" {
		return
	}
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

// counts is what l holds now: connections, and the sources they come from.
func (l *boundedListener) counts() (held, sources int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held, len(l.bySource)
}

// sourceOf is the address a connection's cap is counted by: the IP, an
// IPv6 one by its /64 (what one machine is commonly given).
func sourceOf(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := ta.AddrPort().Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

type connKey struct{}

// boundedConn is one connection of a boundedListener.
type boundedConn struct {
	net.Conn
	l      *boundedListener
	src    netip.Addr
	opened time.Time

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
		c.l.give(c.src, c.run)
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

// warnings logs a warning of each message at most once per refuseEvery,
// counting those it stands for: a flood must not fill the disk with logs.
type warnings struct {
	log *zap.Logger
	mu  sync.Mutex
	by  map[string]*warning
}

type warning struct {
	logged time.Time
	count  int
}

func newWarnings(log *zap.Logger) *warnings {
	if log == nil {
		log = zap.NewNop()
	}
	return &warnings{log: log, by: map[string]*warning{}}
}

// note counts one event of msg, and logs it with fields when its interval has passed.
func (w *warnings) note(msg string, fields ...zap.Field) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.by[msg]
	if e == nil {
		e = &warning{}
		w.by[msg] = e
	}
	e.count++
	now := time.Now()
	if !e.logged.IsZero() && now.Sub(e.logged) < refuseEvery {
		return
	}
	w.log.Warn(msg, append(fields, zap.Int("count", e.count), zap.Duration("interval", refuseEvery))...)
	e.logged, e.count = now, 0
}
