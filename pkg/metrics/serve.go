package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/connlimit"
)

// shutdownTimeout bounds how long stop waits for scrapes in flight.
const shutdownTimeout = 5 * time.Second

// The metrics listener's bounds. It authenticates nobody, so it is
// bounded before anything else: in a hostile-user trial two processes of
// another uid opened 21,000 kept-alive connections on it, the agent
// reached its open-file limit (20,000) and every commit, lease listing and
// journal write failed (`too many open files`); in node mode its memory
// grew from 32 to 517 MB. Now a flood costs the agent at most maxConns
// descriptors and connMemory each, and while it lasts scrapes and probes
// from its sources fail.
const (
	// maxConns bounds the connections held at once; one past it is closed
	// as it is accepted (not queued: a scrape or probe fails at once and
	// is tried again at its next interval).
	maxConns = 512
	// maxConnsPerSource bounds those of one source (connlimit.Source: an
	// IP, every loopback address one), so that one machine
	// or pod cannot hold them all while the kubelet probes or Prometheus
	// scrapes from another.
	maxConnsPerSource = 16
	// A request's header must arrive within readHeaderTimeout and fit in
	// maxHeaderBytes (a scrape's is under 1 KiB); a kept-alive connection
	// idle for idleTimeout is closed: a scraper reconnects each scrape.
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 5 * time.Second
	maxHeaderBytes    = 16 << 10
)

// connMemory is what one held connection costs the agent at most,
// measured (TestServe_Flood: heap and stacks per held connection) and
// rounded up.
const connMemory = 64 << 10

// limits are the metrics listener's connection caps (internal/connlimit).
var limits = connlimit.Limits{Max: maxConns, PerSource: maxConnsPerSource, Name: "metrics"}

// Serve listens on addr at once, so that a bad or busy address fails before
// any trainer starts, then serves m.Handler in the background until ctx ends
// or stop is called. stop is idempotent and returns once the server is shut down.
func Serve(ctx context.Context, addr string, m *Metrics, log *zap.Logger) (stop func(), err error) {
	if log == nil {
		log = zap.NewNop()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	log.Info("metrics listening", zap.String("addr", ln.Addr().String()),
		zap.Int("max_connections", maxConns), zap.Int("max_connections_per_source", maxConnsPerSource))
	return serve(ctx, connlimit.New(ln, limits, log), m, log), nil
}

// serve serves m.Handler on ln until ctx ends or stop is called.
func serve(ctx context.Context, ln net.Listener, m *Metrics, log *zap.Logger) (stop func()) {
	srv := &http.Server{
		Handler:           m.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          zap.NewStdLog(log.Named("metrics-http")),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server ended", zap.Error(err))
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	shutdownDone := make(chan struct{})
	go func() {
		defer close(shutdownDone)
		<-ctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		<-done
	}()
	return func() {
		cancel()
		<-shutdownDone
	}
}
