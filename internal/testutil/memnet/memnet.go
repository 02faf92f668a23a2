// Package memnet is an in-memory network of TCP addresses for tests: its
// listeners and dials are net.Pipe pairs, so that a server and its
// clients (net/http's included) talk inside a testing/synctest bubble,
// where a real socket's wait is not durable and would stop the bubble's
// clock. Each machine of a test is a Host (an IP address) that listens
// on its own address and dials from it, so that a server sees where a
// connection came from, as a real one does. A dial to an address nobody
// listens on is refused at once, as the kernel refuses it (a *net.OpError
// of op "dial", ECONNREFUSED).
package memnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// Network is one in-memory network. The zero value is not usable: New.
type Network struct {
	mu        sync.Mutex
	listeners map[netip.AddrPort]*listener
	ports     map[netip.Addr]*hostPorts // by host: the ports it handed out
}

// hostPorts are one host's last ports handed out: a listen's on port 0
// from 40000, a dial's from 50000, each host on its own, so that a host's
// listening port does not depend on how other goroutines ran (a replay of
// the agent's simulation names the same ports).
type hostPorts struct{ listen, dial uint16 }

// New returns an empty network.
func New() *Network {
	return &Network{listeners: map[netip.AddrPort]*listener{}, ports: map[netip.Addr]*hostPorts{}}
}

// Host is one machine of the network, at ip.
func (n *Network) Host(ip string) *Host {
	return &Host{n: n, ip: netip.MustParseAddr(ip)}
}

// Host is a machine: it listens on its own address and dials from it.
type Host struct {
	n  *Network
	ip netip.Addr
}

// nextPort is a port of ip's that no listener has, from its listen
// counter or its dial counter (n.mu held).
func (n *Network) nextPort(ip netip.Addr, dial bool) uint16 {
	hp := n.ports[ip]
	if hp == nil {
		hp = &hostPorts{listen: 39999, dial: 49999}
		n.ports[ip] = hp
	}
	p := &hp.listen
	if dial {
		p = &hp.dial
	}
	for {
		*p++
		if *p == 0 {
			*p = 1024
		}
		if _, taken := n.listeners[netip.AddrPortFrom(ip, *p)]; !taken {
			return *p
		}
	}
}

// backlog is how many connections a listener holds before they are
// accepted: a dial returns once its connection is queued, as a real
// one returns once the kernel's handshake is done.
const backlog = 128

// Listen listens on addr ("host:port"): host is this machine's address
// or empty (then its address); port 0 is a free one.
func (h *Host) Listen(addr string) (net.Listener, error) {
	hostPart, portPart, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Err: err}
	}
	port, err := strconv.ParseUint(portPart, 10, 16)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Err: fmt.Errorf("bad port %q", portPart)}
	}
	if hostPart != "" && hostPart != h.ip.String() {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Err: os.NewSyscallError("bind", syscall.EADDRNOTAVAIL)}
	}
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if port == 0 {
		port = uint64(h.n.nextPort(h.ip, false))
	}
	ap := netip.AddrPortFrom(h.ip, uint16(port))
	if _, taken := h.n.listeners[ap]; taken {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
	}
	l := &listener{n: h.n, addr: ap, conns: make(chan net.Conn, backlog), closed: make(chan struct{})}
	h.n.listeners[ap] = l
	return l, nil
}

// DialContext connects from this machine to addr ("ip:port"); network
// must be a TCP one.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	refused := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: tcpAddr(addr), Err: err}
	}
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, refused(net.UnknownNetworkError(network))
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, refused(err)
	}
	h.n.mu.Lock()
	l := h.n.listeners[ap]
	from := netip.AddrPortFrom(h.ip, h.n.nextPort(h.ip, true))
	h.n.mu.Unlock()
	if l == nil {
		return nil, refused(os.NewSyscallError("connect", syscall.ECONNREFUSED))
	}
	client, server := net.Pipe()
	local, remote := net.TCPAddrFromAddrPort(from), net.TCPAddrFromAddrPort(ap)
	if !l.queue(&conn{Conn: server, local: remote, remote: local}) {
		client.Close()
		return nil, refused(os.NewSyscallError("connect", syscall.ECONNREFUSED))
	}
	return &conn{Conn: client, local: local, remote: remote}, nil
}

// tcpAddr is addr as a *net.TCPAddr for an error (nil when it is none).
func tcpAddr(addr string) net.Addr {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return nil
}

// listener is a Host's listener: what Accept returns is queued by dials.
type listener struct {
	n      *Network
	addr   netip.AddrPort
	conns  chan net.Conn
	mu     sync.Mutex // queue and Close: no connection is queued after Close
	closed chan struct{}
}

// queue hands c to Accept: false when l is closed or its backlog full
// (the dial is refused).
func (l *listener) queue(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return false
	default:
	}
	select {
	case l.conns <- c:
		return true
	default:
		return false
	}
}

// Accept waits for the next connection.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

// Close stops listening: the address is free again, a dial to it is
// refused, and the connections queued but not accepted are closed.
func (l *listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return &net.OpError{Op: "close", Net: "tcp", Addr: l.Addr(), Err: net.ErrClosed}
	default:
	}
	close(l.closed)
	l.n.mu.Lock()
	delete(l.n.listeners, l.addr)
	l.n.mu.Unlock()
	for {
		select {
		case c := <-l.conns:
			c.Close()
		default:
			return nil
		}
	}
}

// Addr is where l listens, a *net.TCPAddr.
func (l *listener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.addr) }

// conn is one end of a connection, with the TCP addresses of its ends.
type conn struct {
	net.Conn
	local, remote net.Addr
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }
