// Package connlimit bounds a TCP listener before anything on it
// authenticates anyone: the connections it holds at once, and those of one
// source (one machine), so that a flood of connections costs the agent a
// fixed number of descriptors and a bounded memory, never its commits,
// its journal or its trainers' socket. The peer tier's listeners
// (pkg/checkpoint/peertier, issue 46) and the metrics listener
// (pkg/metrics) are bounded by it; a hit cap is logged once a minute
// (Warnings).
package connlimit

import (
	"net"
	"net/netip"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/net/netutil"
)

// Limits are a Listener's caps.
type Limits struct {
	// Max bounds the connections held at once.
	Max int
	// PerSource bounds those of one source (Source): more are closed as
	// they are accepted. 0: no cap per source.
	PerSource int
	// Wait: past Max, new connections wait in the kernel's accept queue
	// (netutil.LimitListener), not in the agent. Otherwise one past Max is
	// closed as it is accepted.
	Wait bool
	// Name begins the warnings' messages ("peer tier", "metrics").
	Name string
	// Source is what PerSource counts by; nil: Source. Tests that stand
	// for several machines on one give each loopback address its own.
	Source func(net.Addr) netip.Addr
}

// Listener is a listener within its Limits: Accept returns a *Conn,
// counted until it is closed.
type Listener struct {
	net.Listener // a LimitListener when Limits.Wait
	lim          Limits
	warn         *Warnings
	// the warnings' messages
	overSource, atMax string

	mu       sync.Mutex
	held     int                // connections held
	bySource map[netip.Addr]int // connections held, by source
}

// New bounds ln by lim; the caps' warnings go to log (nil: none).
func New(ln net.Listener, lim Limits, log *zap.Logger) *Listener {
	if lim.Source == nil {
		lim.Source = Source
	}
	l := &Listener{Listener: ln, lim: lim, warn: NewWarnings(log), bySource: map[netip.Addr]int{},
		overSource: lim.Name + ": connections over the per-source cap closed",
		atMax:      lim.Name + ": at the connection cap: new connections closed"}
	if lim.Wait {
		l.Listener = netutil.LimitListener(ln, lim.Max)
		l.atMax = lim.Name + ": at the connection cap: new connections wait in the kernel's queue"
	}
	return l
}

// Accept returns the next connection within the caps; one over its
// source's cap, or over Max unless Limits.Wait, is closed at once (and
// counted in a warning).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := l.lim.Source(c.RemoteAddr())
		held, why := l.take(src)
		switch why {
		case refusedSource:
			c.Close()
			l.warn.Note(l.overSource, zap.String("source", src.String()), zap.String("remote", c.RemoteAddr().String()), zap.Int("cap", l.lim.PerSource))
			continue
		case refusedMax:
			c.Close()
			l.warn.Note(l.atMax, zap.Int("cap", l.lim.Max))
			continue
		}
		if l.lim.Wait && held == l.lim.Max {
			l.warn.Note(l.atMax, zap.Int("cap", l.lim.Max))
		}
		return &Conn{Conn: c, l: l, src: src}, nil
	}
}

type refusal int

const (
	taken refusal = iota
	refusedSource
	refusedMax
)

// take counts a connection from src, unless a cap is reached. With
// Limits.Wait the LimitListener keeps Max (a connection closing gives its
// slot back before it is uncounted here).
func (l *Listener) take(src netip.Addr) (held int, why refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.lim.PerSource > 0 && l.bySource[src] >= l.lim.PerSource:
		return l.held, refusedSource
	case !l.lim.Wait && l.held >= l.lim.Max:
		return l.held, refusedMax
	}
	l.bySource[src]++
	l.held++
	return l.held, taken
}

// give uncounts a connection from src.
func (l *Listener) give(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// Counts is what l holds now: connections, and the sources they come from.
func (l *Listener) Counts() (held, sources int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held, len(l.bySource)
}

// Source is the address a connection's per-source cap counts it by: its
// IP (an IPv4-mapped IPv6 one as IPv4, an IPv6 one whole, its zone
// dropped), and every loopback address (127.0.0.0/8, ::1) as one: they are
// all this machine, which could otherwise hold PerSource connections from
// each of 127.0.0.2, .3, ... An IPv6 address is not grouped by a prefix:
// the clouds share a /64 among a subnet's machines (AWS, Azure; GCP gives
// a VM a /96 of one, Cilium's pods a /104), which would make a whole
// subnet or cluster one source.
func Source(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := ta.AddrPort().Addr().Unmap().WithZone("")
	if ip.IsLoopback() {
		return loopback
	}
	return ip
}

// loopback is the source of every loopback address.
var loopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// Conn is one connection of a Listener.
type Conn struct {
	net.Conn
	l   *Listener
	src netip.Addr

	once sync.Once
}

// CloseWrite shuts down the writing side, as the connection it wraps does
// (net/http's server sends an error answer, then FIN, and waits a moment
// before it closes: without it, the client could read a reset instead).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close closes the connection and uncounts it (once).
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.give(c.src) })
	return err
}
