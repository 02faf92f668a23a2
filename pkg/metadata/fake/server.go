package fake

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// Server is what every fake offers, for code that handles the three alike
// (the fake-metadata command, benchmarks).
type Server interface {
	// URL is the base URL, http://127.0.0.1:PORT.
	URL() string
	// Env names the environment variable, and its value, that points the
	// cloud's standard client at this fake.
	Env() (name, value string)
	// Notice exposes the cloud's usual termination notice now (AWS: spot
	// terminate in 2 min; GCP: preempted; Azure: Preempt event in 30 s) and
	// returns when it did.
	Notice() time.Time
	// NoticeAfter exposes the cloud's usual termination notice after d;
	// stop cancels it if it has not fired yet.
	NoticeAfter(d time.Duration) (stop func() bool)
	// SetFault makes every answer fail in the way f says; FaultNone heals.
	SetFault(f Fault)
	// LastExposed is when the latest notice became visible (zero if none).
	LastExposed() time.Time
	// Requests counts the HTTP requests served so far.
	Requests() int64
	// Close stops the server; requests still hanging are released.
	Close()
}

// Start serves a fake for cloud ("aws", "gcp" or "azure") on addr
// ("127.0.0.1:0" picks a free port) with default options.
func Start(cloud, addr string) (Server, error) {
	switch cloud {
	case "aws":
		return StartAWS(addr, AWSOptions{})
	case "gcp":
		return StartGCP(addr, GCPOptions{})
	case "azure":
		return StartAzure(addr, AzureOptions{})
	}
	return nil, fmt.Errorf("unknown cloud %q (want aws, gcp or azure)", cloud)
}

// base holds what the three fakes share: the HTTP server, the current
// fault, the exposure clock and the request counter.
type base struct {
	srv       *httptest.Server
	closing   chan struct{}
	closeOnce sync.Once
	requests  atomic.Int64

	fmu      sync.Mutex
	fault    Fault
	released chan struct{} // closed when the fault changes

	// exempt, when set, lets a request through despite the fault.
	exempt func(r *http.Request, f Fault) bool

	emu     sync.Mutex
	exposed time.Time
}

func (b *base) start(addr string, h http.Handler) error {
	b.closing = make(chan struct{})
	b.released = make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests.Add(1)
		b.fmu.Lock()
		f, rel := b.fault, b.released
		b.fmu.Unlock()
		if (b.exempt == nil || !b.exempt(r, f)) && serveFault(w, r, f, rel, b.closing) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	if addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		_ = srv.Listener.Close()
		srv.Listener = l
	}
	srv.Start()
	b.srv = srv
	return nil
}

// URL is the base URL of the fake, http://127.0.0.1:PORT.
func (b *base) URL() string { return b.srv.URL }

// Addr is the fake's host:port.
func (b *base) Addr() string { return b.srv.Listener.Addr().String() }

// Requests counts the HTTP requests served so far.
func (b *base) Requests() int64 { return b.requests.Load() }

// SetFault makes every answer fail in the way f says; FaultNone heals.
func (b *base) SetFault(f Fault) {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	b.fault = f
	close(b.released)
	b.released = make(chan struct{})
}

// LastExposed is when the latest notice became visible (zero if none).
func (b *base) LastExposed() time.Time {
	b.emu.Lock()
	defer b.emu.Unlock()
	return b.exposed
}

// expose records now as the instant a notice became visible and returns it.
// Call it with the state lock held, right after changing the state.
func (b *base) expose() time.Time {
	now := time.Now()
	b.emu.Lock()
	b.exposed = now
	b.emu.Unlock()
	return now
}

// Close stops the server; requests still hanging are released.
func (b *base) Close() {
	b.closeOnce.Do(func() {
		close(b.closing)
		b.srv.Close()
	})
}
