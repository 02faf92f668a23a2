package peertier

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Listener is one TCP listener that serves the peer tier of several runs:
// a node agent's (spotagent node) hosted runs of multi-node jobs, as their
// heartbeats share one UDP socket (pkg/liveness). Each request names the
// run and node it asks (query r and n: routing only); the run's server
// then checks the request as a listener of its own would, against that
// job's secret. A run stops being served when its Node closes; transfers
// in flight then end within the stall bound.
//
// Its bounds are a listener of its own's (limits.go), with a share of
// the kept-alive connections per run. Before authentication nothing tells
// a hosted run from one not hosted: a request for a run not hosted has
// its MAC computed (with a key of no run) as a hosted run's would, and
// both, unauthenticated, get the same 503.
type Listener struct {
	ln    net.Listener
	srv   *http.Server
	wg    sync.WaitGroup
	noKey []byte // a random key: the MAC of a request for a run not hosted

	mu   sync.Mutex
	runs map[string]*server // by run + "\x00" + node
}

// Listen starts a shared listener on the TCP address addr (":0": a port
// of the kernel's choice). Close stops it.
func Listen(addr string, log *zap.Logger) (*Listener, error) {
	if log == nil {
		log = zap.NewNop()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer tier: %w", err)
	}
	l := &Listener{ln: bound(ln, log), runs: map[string]*server{}, noKey: make([]byte, 32)}
	rand.Read(l.noKey)
	l.srv = newHTTPServer(l, readHeaderTimeout)
	l.wg.Go(func() {
		if err := l.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("peer tier: shared server stopped", zap.Error(err))
		}
	})
	return l, nil
}

// Addr is where the listener listens.
func (l *Listener) Addr() *net.TCPAddr { return l.ln.Addr().(*net.TCPAddr) }

// Close stops the listener and every transfer in flight.
func (l *Listener) Close() {
	l.srv.Close()
	l.wg.Wait()
}

func routeKey(run, node string) string { return run + "\x00" + node }

// add serves run's node with s; an error if that node of that run is
// served already (a second agent of the same node on this machine).
func (l *Listener) add(run, node string, s *server) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := routeKey(run, node)
	if _, ok := l.runs[k]; ok {
		return fmt.Errorf("peer tier: %s of run %s is served on this listener already", node, run)
	}
	l.runs[k] = s
	return nil
}

// remove stops serving run's node, if s still serves it.
func (l *Listener) remove(run, node string, s *server) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := routeKey(run, node); l.runs[k] == s {
		delete(l.runs, k)
	}
}

func (l *Listener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r) // server.go: the same checks for every run
	if !ok {
		return
	}
	q := r.URL.Query()
	l.mu.Lock()
	s := l.runs[routeKey(q.Get("r"), q.Get("n"))]
	l.mu.Unlock()
	if s == nil {
		// No such run here (yet): its pod may be starting again on this
		// node, and will publish a new session's record (unhosted: 503).
		// The MAC is computed all the same, so that the answer takes as
		// long as a hosted run's refusal.
		req.check(l.noKey, q.Get("r"), time.Now())
		unhosted(w)
		return
	}
	s.serve(w, r, req)
}
