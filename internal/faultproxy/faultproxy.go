// Package faultproxy is a fault-injecting HTTP reverse proxy for tests and
// benchmarks. It sits on 127.0.0.1 in front of a store server (the
// in-process S3 or GCS fakes, or anything else that speaks HTTP/1.1) and
// injects one fault at a time: S3 503 SlowDown, 500, a connection reset
// part-way through the request or the response body, a stall, or a
// bandwidth limit. The fault applies to a count of requests, to a fraction
// of them, or to every one, and can be switched while clients run.
package faultproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is the kind of fault injected.
type Mode int

const (
	// Pass forwards requests untouched.
	Pass Mode = iota
	// SlowDown answers 503 with S3's SlowDown XML error body.
	SlowDown
	// InternalError answers 500 with S3's InternalError XML error body.
	InternalError
	// ResetRequest reads Fault.After bytes of the request body, then resets
	// the connection (TCP RST): the request never reaches the target.
	ResetRequest
	// ResetResponse forwards the request (the target does the work), sends
	// the first Fault.After bytes of the response (status line and headers
	// included), then resets the connection: the client cannot know whether
	// the request succeeded. After 0 sends nothing at all.
	ResetResponse
	// Stall holds the request for Fault.Stall (or until the client gives
	// up, or the fault is switched), then forwards it.
	Stall
	// Slow forwards the request with its body and the response body each
	// limited to Fault.Rate bytes per second.
	Slow
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case SlowDown:
		return "slowdown"
	case InternalError:
		return "500"
	case ResetRequest:
		return "reset-request"
	case ResetResponse:
		return "reset-response"
	case Stall:
		return "stall"
	case Slow:
		return "slow"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Fault describes what to inject and into which requests.
type Fault struct {
	Mode Mode
	// Count, when > 0, stops the fault after it was injected Count times.
	Count int
	// Fraction, when > 0, injects into each matching request with this
	// probability (seeded: see Start). Zero means every matching request.
	Fraction float64
	// After is how many bytes ResetRequest (of the request body) and
	// ResetResponse (of the whole response) let through before the reset.
	After int64
	// Stall is how long Stall holds a request.
	Stall time.Duration
	// Rate is Slow's limit in bytes per second.
	Rate int64
	// Match, when set, limits the fault to the requests it accepts.
	Match func(*http.Request) bool
}

// Stats counts what the proxy saw.
type Stats struct {
	Requests int64 // requests received
	Faults   int64 // faults injected (under the current and earlier Faults)
}

// Proxy is a running fault-injecting proxy.
type Proxy struct {
	URL  string // http://127.0.0.1:port
	Host string // 127.0.0.1:port

	target    *url.URL
	transport *http.Transport
	srv       *http.Server
	ln        net.Listener

	mu       sync.Mutex
	fault    Fault
	injected int           // under the current fault
	changed  chan struct{} // closed when the fault is switched
	rng      *rand.Rand

	requests atomic.Int64
	faults   atomic.Int64
	closed   chan struct{}
}

// Start serves a proxy to target (http://host:port) on 127.0.0.1. seed
// drives the Fraction draws. The caller closes it.
func Start(target string, seed uint64) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: target %q: want http://host:port", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{
		URL: "http://" + ln.Addr().String(), Host: ln.Addr().String(),
		target: u, ln: ln,
		// No compression: bodies and their lengths pass through unchanged.
		transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64, Proxy: nil},
		changed:   make(chan struct{}),
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		closed:    make(chan struct{}),
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	return p, nil
}

// Set replaces the current fault (Fault{} passes everything) and wakes
// requests a Stall holds.
func (p *Proxy) Set(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.injected = f, 0
	close(p.changed)
	p.changed = make(chan struct{})
}

// Clear is Set(Fault{}).
func (p *Proxy) Clear() { p.Set(Fault{}) }

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Requests: p.requests.Load(), Faults: p.faults.Load()}
}

// Close stops the proxy and drops every connection.
func (p *Proxy) Close() {
	select {
	case <-p.closed:
		return
	default:
	}
	close(p.closed)
	p.srv.Close()
	p.transport.CloseIdleConnections()
}

// pick decides the fault for one request.
func (p *Proxy) pick(r *http.Request) (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.fault
	switch {
	case f.Mode == Pass:
	case f.Match != nil && !f.Match(r):
	case f.Count > 0 && p.injected >= f.Count:
	case f.Fraction > 0 && p.rng.Float64() >= f.Fraction:
	default:
		p.injected++
		p.faults.Add(1)
		return f, p.changed
	}
	return Fault{}, p.changed
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	f, changed := p.pick(r)
	switch f.Mode {
	case SlowDown:
		s3Error(w, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
	case InternalError:
		s3Error(w, http.StatusInternalServerError, "InternalError", "We encountered an internal error. Please try again.")
	case ResetRequest:
		io.CopyN(io.Discard, r.Body, f.After)
		reset(w)
	case ResetResponse:
		p.forward(w, r, f)
	case Stall:
		t := time.NewTimer(f.Stall)
		defer t.Stop()
		select {
		case <-t.C:
		case <-changed:
		case <-r.Context().Done():
			return
		case <-p.closed:
			return
		}
		p.forward(w, r, Fault{})
	default:
		p.forward(w, r, f)
	}
}

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor is Expect: the
// proxy has read the body by the time it matters.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect"}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, f Fault) {
	var body io.Reader = r.Body
	if f.Mode == Slow {
		body = &limitedReader{ctx: r.Context(), r: r.Body, rate: f.Rate}
	}
	if r.ContentLength == 0 {
		body = http.NoBody
	}
	u := *p.target
	u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.ContentLength = r.ContentLength
	// The original Host: servers that build URLs from it (resumable upload
	// locations) then point clients back at the proxy.
	out.Host = r.Host
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		if r.Context().Err() == nil {
			http.Error(w, "faultproxy: "+err.Error(), http.StatusBadGateway)
		}
		return
	}
	defer resp.Body.Close()
	for _, h := range hopHeaders {
		resp.Header.Del(h)
	}
	if loc := resp.Header.Get("Location"); loc != "" {
		resp.Header.Set("Location", strings.Replace(loc, p.target.Host, p.Host, 1))
	}
	if f.Mode == ResetResponse {
		p.resetResponse(w, resp, f.After)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	var rb io.Reader = resp.Body
	if f.Mode == Slow {
		rb = &limitedReader{ctx: r.Context(), r: resp.Body, rate: f.Rate}
	}
	io.Copy(flushWriter{w}, rb)
}

// resetResponse writes the first after bytes of the response on the raw
// connection, then resets it.
func (p *Proxy) resetResponse(w http.ResponseWriter, resp *http.Response, after int64) {
	conn, _, err := hijack(w)
	if err != nil {
		return
	}
	defer rst(conn)
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %s\r\n", resp.Status)
	if resp.ContentLength >= 0 {
		resp.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	resp.Header.Write(&head)
	head.WriteString("\r\n")
	io.CopyN(conn, io.MultiReader(&head, resp.Body), after)
}

func s3Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<Error><Code>%s</Code><Message>%s</Message><RequestId>faultproxy</RequestId></Error>`, code, msg)
}

// reset drops the client's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	if conn, _, err := hijack(w); err == nil {
		rst(conn)
	}
}

func hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("faultproxy: cannot hijack")
	}
	return hj.Hijack()
}

func rst(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) // close sends RST, not FIN
	}
	conn.Close()
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// limitedReader passes at most rate bytes per second on average, in small
// reads so the flow is smooth rather than bursty.
type limitedReader struct {
	ctx   context.Context
	r     io.Reader
	rate  int64
	start time.Time
	n     int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.rate <= 0 {
		return l.r.Read(p)
	}
	if l.start.IsZero() {
		l.start = time.Now()
	}
	if chunk := max(l.rate/20, 512); int64(len(p)) > chunk {
		p = p[:chunk]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	due := l.start.Add(time.Duration(float64(l.n) / float64(l.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.ctx.Done():
			return n, l.ctx.Err()
		}
	}
	return n, err
}
