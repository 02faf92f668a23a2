package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/connlimit"
	"github.com/spotagent/spotagent/internal/testutil"
)

// openFDs is how many descriptors this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("descriptors not countable here: %v", err)
	}
	return len(ents) - 1 // ReadDir's own
}

// healthz opens a connection to addr from the loopback address src and
// asks /healthz on it, as the trial's flood did; it reports whether it
// was answered (and the connection kept) or closed by the server.
func healthz(t *testing.T, src, addr string) (c net.Conn, answered bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testutil.Wait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(testutil.Wait))
	defer c.SetDeadline(time.Time{})
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") // closed: the read below says so
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a connection from %s: neither answered nor closed", src)
	}
	if err != nil {
		return c, false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz from %s: %d", src, resp.StatusCode)
	}
	return c, true
}

// flood opens per connections from each of srcs to addr, asks /healthz on
// each and keeps them all open (the test's end closes them); it returns
// them and how many were answered.
func flood(t *testing.T, addr string, srcs []string, per int) (conns []net.Conn, answered int) {
	t.Helper()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for _, src := range srcs {
		for range per {
			c, ok := healthz(t, src, addr)
			conns = append(conns, c)
			if ok {
				answered++
			}
		}
	}
	return conns, answered
}

// scrapesAfter waits until a fresh scrape of addr is answered, once the
// flood's connections are closed.
func scrapesAfter(t *testing.T, addr string, conns []net.Conn) {
	t.Helper()
	for _, c := range conns {
		c.Close()
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: testutil.Wait}
	testutil.WaitFor(t, "a scrape answered after the flood", func() bool {
		resp, err := hc.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// loopbacks is n loopback addresses from prefix.1 on.
func loopbacks(prefix string, n int) []string {
	var a []string
	for i := range n {
		a = append(a, fmt.Sprintf("%s.%d", prefix, 1+i))
	}
	return a
}

// fdSlack is what else the process may open while the test counts.
const fdSlack = 8

// The metrics listener holds at most maxConns connections, and
// maxConnsPerSource of one machine (every loopback address one source):
// a flood of kept-alive connections costs the agent that many
// descriptors and connMemory each, and a scrape is answered once it ends
// (a hostile-user trial: two processes of another uid held 21,000 on it,
// the agent ran out of descriptors and every commit failed).
func TestServe_Flood(t *testing.T) {
	t.Run("OneMachine", func(t *testing.T) {
		addr := testutil.FreeAddr(t)
		stop, err := Serve(context.Background(), addr, New(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		base := openFDs(t)
		// The trial's two processes, from ten loopback addresses.
		conns, answered := flood(t, addr, loopbacks("127.0.3", 10), 2*maxConnsPerSource)
		held := openFDs(t) - base - len(conns)
		t.Logf("%d connections from 10 loopback addresses: %d answered, the server holds %d descriptors", len(conns), answered, held)
		if held > maxConnsPerSource+fdSlack {
			t.Fatalf("the server holds %d descriptors for one machine's %d connections, want at most maxConnsPerSource %d (+%d)", held, len(conns), maxConnsPerSource, fdSlack)
		}
		scrapesAfter(t, addr, conns)
	})
	t.Run("ManySources", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		manyMachines := limits
		manyMachines.Source = func(a net.Addr) netip.Addr { return a.(*net.TCPAddr).AddrPort().Addr().Unmap() }
		l := connlimit.New(ln, manyMachines, nil)
		stop := serve(context.Background(), l, New(), zap.NewNop())
		defer stop()
		addr := ln.Addr().String()

		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		base := openFDs(t)
		// More sources than maxConns holds at maxConnsPerSource each.
		machines := maxConns/maxConnsPerSource + 8
		conns, answered := flood(t, addr, loopbacks("127.0.4", machines), 2*maxConnsPerSource)
		fds := openFDs(t) - base - len(conns)
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		n, sources := l.Counts()
		t.Logf("%d connections from %d sources: %d answered; the server holds %d (%d descriptors) from %d sources", len(conns), machines, answered, n, fds, sources)
		if n > maxConns || fds > maxConns+fdSlack {
			t.Fatalf("the server holds %d connections, %d descriptors, want at most maxConns %d (+%d descriptors)", n, fds, maxConns, fdSlack)
		}
		if n > 0 {
			per := (int64(ms1.HeapAlloc+ms1.StackInuse) - int64(ms0.HeapAlloc+ms0.StackInuse)) / int64(n)
			t.Logf("heap and stacks per held connection: %d bytes (both ends in this process)", per)
			if per > connMemory {
				t.Fatalf("%d bytes per held connection, want at most connMemory %d", per, connMemory)
			}
		}
		scrapesAfter(t, addr, conns)
	})
}

// A kept-alive connection left idle is closed after idleTimeout: a flood
// that reads its answer and waits holds its connections seconds, not
// minutes (they were held 2 min).
func TestServe_IdleClosed(t *testing.T) {
	addr := testutil.FreeAddr(t)
	stop, err := Serve(context.Background(), addr, New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c, answered := healthz(t, "127.0.0.1", addr)
	defer c.Close()
	if !answered {
		t.Fatal("/healthz not answered")
	}
	start := time.Now()
	c.SetReadDeadline(start.Add(idleTimeout + testutil.Wait))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("an idle connection still open %s after its answer (idleTimeout %s): %v", time.Since(start).Round(time.Millisecond), idleTimeout, err)
	}
	t.Logf("an idle connection closed %s after its answer", time.Since(start).Round(time.Millisecond))
}
