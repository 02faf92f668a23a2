package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spotagent/spotagent/pkg/cloud/wrap"
)

var _ wrap.Observer = (*Metrics)(nil)

// storeCollectors are the store's operations as the wrapper all.Open
// stacks around every backend sees them: each attempt, so retries show as
// failed operations followed by a good one.
type storeCollectors struct {
	ops     *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newStoreCollectors(reg prometheus.Registerer) storeCollectors {
	c := storeCollectors{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotagent_store_operations_total",
			Help: "Store operations (each attempt) by operation (put, get, stat, list, delete, cleanup) and result (ok, not_found, precondition, denied, cancelled, error).",
		}, []string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "spotagent_store_operation_seconds",
			Help:    "Duration of store operations (each attempt; for get, until the first byte).",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 10), // 5ms … ~98s
		}, []string{"op"}),
	}
	reg.MustRegister(c.ops, c.seconds)
	return c
}

// StoreOp implements wrap.Observer: all.Options.Observer takes the agent's
// Metrics.
func (m *Metrics) StoreOp(op, result string, took time.Duration) {
	m.store.ops.WithLabelValues(op, result).Inc()
	m.store.seconds.WithLabelValues(op).Observe(took.Seconds())
}
