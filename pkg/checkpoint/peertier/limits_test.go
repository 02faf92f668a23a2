package peertier

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/connlimit"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// raiseNoFile raises the soft limit on descriptors to the hard one, and
// skips the test when that is under need.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
	}
	if rl.Cur < need {
		t.Skipf("RLIMIT_NOFILE %d (hard), want %d: raise ulimit -n to run this test", rl.Cur, need)
	}
}

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testutil.Wait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closedByServer reports whether the server closed c within d: a read
// ends in EOF or a reset (what it sent before is discarded).
func closedByServer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// serveBounded serves node p's server on a listener of its own bounded
// by lim, whose header timeout is a minute, not readHeaderTimeout: a
// loaded machine may take longer than that to open the test's connections.
func serveBounded(t *testing.T, p *Node, lim connlimit.Limits) (*boundedListener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := boundWithin(ln, lim, nil)
	srv := newHTTPServer(p.serving, time.Minute)
	done := make(chan struct{})
	go func() { srv.Serve(l); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return l, l.Addr().String()
}

// waitHeld waits until l holds want connections.
func waitHeld(t *testing.T, l *boundedListener, want int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%d connections held", want), func() bool { held, _ := l.Counts(); return held == want })
}

// byIP counts each loopback address as a source of its own: the test's
// stand-in for many machines.
func byIP(a net.Addr) netip.Addr { return a.(*net.TCPAddr).AddrPort().Addr().Unmap() }

// A peer listener holds at most maxConnsPerSource connections of one
// source, and maxConns in all (the rest wait in the kernel's queue, not
// in the agent); a connection costs at most connMemory; another source
// is still served while one floods (#46 item 2).
func TestListenerBounds(t *testing.T) {
	raiseNoFile(t, maxConns+4*maxConnsPerSource+256)
	r := newRig(t)
	r.commit(0)
	manyMachines := limits
	manyMachines.Source = byIP
	l, addr := serveBounded(t, r.serve(0, nil, 0), manyMachines)

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// One source: its connections past the cap are closed at once.
	for range maxConnsPerSource {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
	}
	waitHeld(t, l, maxConnsPerSource)
	extra := dialFrom(t, "127.0.0.2", addr)
	defer extra.Close()
	if !closedByServer(extra, testutil.Wait) {
		t.Fatalf("connection %d of one source: still open, want closed", maxConnsPerSource+1)
	}

	// Many sources: maxConns held, a slow header each; the others wait.
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	half := fmt.Sprintf("GET %s?n=node-0&t=s&c=%s&f=%s HTTP/1.1\r\nHost: x\r\nX-Pad: %s", filePath, folder(r.m), strings.Repeat("f", 1000), strings.Repeat("p", 4000))
	for i := 0; len(conns) < maxConns+maxConnsPerSource; i++ {
		c := dialFrom(t, fmt.Sprintf("127.0.1.%d", 1+i/maxConnsPerSource), addr)
		conns = append(conns, c)
		c.Write([]byte(half))
	}
	waitHeld(t, l, maxConns)
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	per := (int64(ms1.HeapAlloc+ms1.StackInuse) - int64(ms0.HeapAlloc+ms0.StackInuse)) / int64(maxConns-maxConnsPerSource)
	t.Logf("heap and stacks per held connection with a 5 KB header half sent: %d bytes (both ends in this process)", per)
	if per > connMemory {
		t.Fatalf("%d bytes per held connection, want at most connMemory %d", per, connMemory)
	}
	if held, _ := l.Counts(); held != maxConns {
		t.Fatalf("%d connections held, want the cap %d", held, maxConns)
	}
	// Closing as many as wait in the queue, and as many again, frees room:
	// another source is served.
	for _, c := range conns[:2*maxConnsPerSource] {
		c.Close()
	}
	conns = conns[2*maxConnsPerSource:]
	req := signed(r.nodes[0].peer.token, "run", target{"node-0", "s"}, folder(r.m), checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}, time.Now())
	resp, err := http.Get("http://" + addr + filePath + "?" + req.query())
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a valid request from another source during the flood: %d, want 200", resp.StatusCode)
	}
}

// Every loopback address is one source: one machine cannot hold more
// than maxConnsPerSource by connecting from 127.0.0.2, .3, ... (a
// hostile-user trial: 10 of them, 64 connections each, held all 512).
func TestListenerBounds_LoopbackIsOneSource(t *testing.T) {
	const addrs = 10
	raiseNoFile(t, addrs*maxConnsPerSource+256)
	r := newRig(t)
	r.commit(0)
	l, addr := serveBounded(t, r.serve(0, nil, 0), limits)

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range maxConnsPerSource {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
	}
	waitHeld(t, l, maxConnsPerSource)
	for i := 3; i < 3+addrs-1; i++ {
		src := fmt.Sprintf("127.0.0.%d", i)
		for range maxConnsPerSource {
			c := dialFrom(t, src, addr)
			conns = append(conns, c)
			if !closedByServer(c, testutil.Wait) {
				held, sources := l.Counts()
				t.Fatalf("a connection from %s while 127.0.0.2 holds %d: still open, want closed (%d held, from %d sources)", src, maxConnsPerSource, held, sources)
			}
		}
	}
	if held, sources := l.Counts(); held != maxConnsPerSource || sources != 1 {
		t.Fatalf("%d connections held from %d sources, want %d from 1", held, sources, maxConnsPerSource)
	}
}

// exchange sends raw request lines on c and reads one response.
func exchange(t *testing.T, c net.Conn, br *bufio.Reader, req request) *http.Response {
	t.Helper()
	fmt.Fprintf(c, "GET %s?%s HTTP/1.1\r\nHost: x\r\n\r\n", filePath, req.query())
	c.SetReadDeadline(time.Now().Add(testutil.Wait))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// Only an authenticated request keeps its connection, and then for at
// most maxConnRequests requests (#46 item 2: each unauthenticated request
// used to reset the idle timer, so a flood held every connection).
func TestOnlyAuthenticatedKeepAlive(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	p := r.serve(0, nil, 0)
	forged := request{node: "node-0", session: "s", ckpt: folder(r.m), file: "replica-0.bin", size: replicaBytes, expiry: time.Now().Add(time.Minute).Unix(), mac: "00"}
	c := dialFrom(t, "127.0.0.1", p.Addr().String())
	defer c.Close()
	if resp := exchange(t, c, bufio.NewReader(c), forged); resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Fatalf("unauthenticated: %d, close %v; want 403 and the connection closed", resp.StatusCode, resp.Close)
	}
	if !closedByServer(c, testutil.Wait) {
		t.Fatal("the connection of an unauthenticated request stayed open")
	}

	// Authenticated (for a checkpoint not held: 404, nothing read): kept,
	// up to maxConnRequests.
	c = dialFrom(t, "127.0.0.1", p.Addr().String())
	defer c.Close()
	br := bufio.NewReader(c)
	notHeld := checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}
	for i := 1; ; i++ {
		resp := exchange(t, c, br, signed(p.token, "run", target{"node-0", "s"}, "000000000011-c11", notHeld, time.Now()))
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("request %d: %d, want 404", i, resp.StatusCode)
		}
		if resp.Close {
			if i != maxConnRequests {
				t.Fatalf("connection closed after %d requests, want %d", i, maxConnRequests)
			}
			break
		}
		if i > maxConnRequests {
			t.Fatalf("connection still kept after %d requests", i)
		}
	}
}

// A kept connection's age, and each run's share of them (node mode's
// shared listener), end its keep-alive.
func TestKeepAliveShareAndAge(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := bound(ln, nil)
	defer l.Close()
	conn := func() *boundedConn { return &boundedConn{l: l, opened: time.Now(), Conn: nopConn{}} }
	old := conn()
	old.opened = time.Now().Add(-maxConnAge)
	if old.keep("a") {
		t.Fatal("a connection past maxConnAge kept")
	}
	var as []*boundedConn
	for range perRunConns {
		c := conn()
		if !c.keep("a") {
			t.Fatalf("connection %d of run a not kept, want %d kept", len(as)+1, perRunConns)
		}
		as = append(as, c)
	}
	if conn().keep("a") {
		t.Fatalf("connection %d of run a kept: past its share", perRunConns+1)
	}
	b := conn()
	if !b.keep("b") {
		t.Fatal("run b's connection not kept while run a holds its share")
	}
	if b.keep("a") {
		t.Fatal("a connection kept for run b kept for run a too")
	}
	as[0].Close()
	if !conn().keep("a") {
		t.Fatal("run a's share not freed by a closed connection")
	}
}

type nopConn struct{ net.Conn }

func (nopConn) Close() error { return nil }

// A slow request (a header sent a byte at a time) holds its connection
// at most the header timeout (min(stall, readHeaderTimeout)).
func TestSlowHeaderCutOff(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	p := r.serve(0, nil, time.Second)
	c := dialFrom(t, "127.0.0.1", p.Addr().String())
	defer c.Close()
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		line := "GET " + filePath + "?n=node-0 HTTP/1.1\r\nX-Slow: "
		for i := 0; ; i++ {
			if _, err := c.Write([]byte{line[i%len(line)]}); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond): // the drip's pace, not a synchronisation
			}
		}
	}()
	if !closedByServer(c, time.Second+testutil.Wait) {
		t.Fatal("a dripped header still open")
	}
	t.Logf("a dripped header cut off after %s (header timeout 1s)", time.Since(start).Round(time.Millisecond))
}

// The skew window: a request signed within maxSkew of the server's clock,
// either way, is served; past it, it is refused and logged as skew, not
// as a forged request (#46 item 3).
func TestSkewWindow(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	core, logs := observer.New(zap.InfoLevel)
	r.log = zap.New(core)
	p := r.serve(0, nil, 0)
	f := checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}
	ask := func(skew time.Duration) int {
		return r.ask(p, signed(p.token, "run", target{"node-0", "s"}, folder(r.m), f, time.Now().Add(skew)))
	}
	for _, skew := range []time.Duration{-maxSkew + 30*time.Second, maxSkew - 30*time.Second} {
		if got := ask(skew); got != http.StatusOK {
			t.Fatalf("signed by a clock %s off: %d, want 200", skew, got)
		}
	}
	if got := ask(-maxSkew - time.Minute); got != http.StatusForbidden {
		t.Fatalf("signed by a clock %s off: %d, want 403", -maxSkew-time.Minute, got)
	}
	sk := logs.FilterMessage("peer tier: a peer's clock is outside the skew window: its requests are refused").All()
	if len(sk) != 1 {
		t.Fatalf("%d skew warnings, want 1: %v", len(sk), logs.All())
	}
	if s := sk[0].ContextMap()["skew_s"].(float64); s > -360 || s < -362 {
		t.Fatalf("skew_s %v, want about -360", s)
	}
	if n := logs.FilterMessage("peer tier: requests refused").Len(); n != 0 {
		t.Fatalf("a skewed signature logged as a refused (forged) request %d times", n)
	}
}

// On node mode's shared listener, an unauthenticated request for a
// hosted run and one for a run not hosted get the same answer (#46 item 3:
// run ids were enumerable by the 503 "run not hosted").
func TestSharedListenerHidesHostedRuns(t *testing.T) {
	l, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := newRig(t)
	r.commit(0)
	p, err := Start(t.Context(), Config{Store: r.st.Store, RunID: "run", Node: "node-0", Session: "s", Advertise: []string{"127.0.0.1"}, Local: r.nodes[0].tier, Shared: l})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	answer := func(run string) string {
		req := signed([]byte("not the job's secret, 32 bytes.."), run, target{"node-0", "s"}, folder(r.m), checkpoint.File{Path: "replica-0.bin", Size: replicaBytes}, time.Now())
		resp, err := http.Get("http://" + l.Addr().String() + filePath + "?" + req.query() + "&r=" + run + "&n=node-0")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		resp.Header.Del("Date")
		return fmt.Sprintf("%d %v %q", resp.StatusCode, resp.Header, b)
	}
	hosted, unhosted := answer("run"), answer("no-such-run")
	if hosted != unhosted {
		t.Fatalf("unauthenticated, hosted run: %s; run not hosted: %s; want the same", hosted, unhosted)
	}
	if !strings.HasPrefix(hosted, "503 ") {
		t.Fatalf("answer %s, want 503 (the asker of a run starting again waits for its record)", hosted)
	}
}
