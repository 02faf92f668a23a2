package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// shutdownTimeout bounds how long stop waits for scrapes in flight.
const shutdownTimeout = 5 * time.Second

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
	srv := &http.Server{
		Handler:           m.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(log.Named("metrics-http")),
	}
	log.Info("metrics listening", zap.String("addr", ln.Addr().String()))
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
	}, nil
}
