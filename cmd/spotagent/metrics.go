package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metrics"
)

// serveMetrics starts the metrics listener when addr is set. It fails at
// once on a bad or busy address, before any trainer starts. The returned
// stop shuts the listener down; it is never nil.
func serveMetrics(addr string, log *zap.Logger) (*metrics.Metrics, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	m := metrics.New()
	stop, err := metrics.Serve(context.Background(), addr, m, log)
	if err != nil {
		return nil, func() {}, err // "metrics: listen tcp ADDR: ..." names the address
	}
	return m, stop, nil
}
