package connlimit

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Every loopback address is one source, an IPv4-mapped address its IPv4
// one, an IPv6 address itself (not its /64: a cloud subnet's machines
// share one), whatever its zone.
func TestSource(t *testing.T) {
	src := func(ip string) netip.Addr { return Source(&net.TCPAddr{IP: net.ParseIP(ip), Port: 1234}) }
	if a, b := Source(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}), Source(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth1"}); a != b {
		t.Errorf("fe80::1 on two interfaces: sources %v and %v, want one", a, b)
	}
	for _, same := range [][]string{
		{"127.0.0.1", "127.0.0.2", "127.0.0.11", "127.255.255.254", "::1", "::ffff:127.0.0.5"},
		{"10.0.0.1", "::ffff:10.0.0.1"},
	} {
		for _, ip := range same[1:] {
			if got, want := src(ip), src(same[0]); got != want {
				t.Errorf("source of %s: %v, want %s's %v", ip, got, same[0], want)
			}
		}
	}
	for _, other := range [][2]string{{"10.0.0.1", "10.0.0.2"}, {"10.0.0.1", "127.0.0.1"}, {"2001:db8::1", "2001:db8:0:1::1"}, {"2001:db8::1", "2001:db8::ffff:1"}, {"::1", "::2"}} {
		if a, b := src(other[0]), src(other[1]); a == b {
			t.Errorf("%s and %s: one source %v, want two", other[0], other[1], a)
		}
	}
}

// byIP counts each loopback address as a source of its own: the test's
// stand-in for many machines.
func byIP(a net.Addr) netip.Addr { return a.(*net.TCPAddr).AddrPort().Addr().Unmap() }

// serve accepts l's connections and holds them until the test ends.
func serve(t *testing.T, l *Listener) <-chan net.Conn {
	t.Helper()
	accepted := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	})
	return accepted
}

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testutil.Wait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c within d.
func closedByServer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// Without Wait, a connection past Max is closed as it is accepted, as is
// one past its source's cap; a closed connection frees its room; each cap
// hit is one warning, not one per connection.
func TestListener_CloseAtMax(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	l := New(ln, Limits{Max: 4, PerSource: 2, Name: "test", Source: byIP}, zap.New(core))
	accepted := serve(t, l)
	addr := ln.Addr().String()
	held := func(want int) {
		t.Helper()
		testutil.WaitFor(t, fmt.Sprintf("%d connections held", want), func() bool { n, _ := l.Counts(); return n == want })
	}
	refused := func(src string) {
		t.Helper()
		if c := dialFrom(t, src, addr); !closedByServer(c, testutil.Wait) {
			t.Fatalf("a connection from %s: still open, want closed", src)
		}
	}

	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.2", addr)
	held(2)
	refused("127.0.0.2") // its source's cap
	refused("127.0.0.2")
	dialFrom(t, "127.0.0.3", addr)
	dialFrom(t, "127.0.0.3", addr)
	held(4)
	refused("127.0.0.4") // Max
	refused("127.0.0.4")
	if n, sources := l.Counts(); n != 4 || sources != 2 {
		t.Fatalf("%d connections from %d sources held, want 4 from 2", n, sources)
	}
	(<-accepted).Close()
	held(3)
	dialFrom(t, "127.0.0.4", addr)
	held(4)

	for _, msg := range []string{"test: connections over the per-source cap closed", "test: at the connection cap: new connections closed"} {
		if n := logs.FilterMessage(msg).Len(); n != 1 {
			t.Errorf("%d warnings %q for 2 connections, want 1: %v", n, msg, logs.All())
		}
	}
}

// A held connection shuts down its writing side as the TCP connection it
// wraps does: net/http's server sends an error answer (400, 431), then
// FIN, and reads a moment before it closes; hidden behind the wrapper,
// it closed at once and the client could read a reset, not the answer.
func TestConn_CloseWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, Limits{Max: 4, Name: "test"}, nil)
	accepted := serve(t, l)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	cw, ok := s.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("%T has no CloseWrite", s)
	}
	if _, err := s.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(testutil.Wait))
	if got, err := io.ReadAll(c); err != nil || string(got) != "answer" {
		t.Fatalf("read %q, %v: want the answer, then EOF", got, err)
	}
}
