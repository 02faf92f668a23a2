// Package metrics exports the agent's measurements to Prometheus and serves
// the health endpoints. It measures each of supervisor.Metrics' parts on
// its own registry, so nothing else in the process leaks into /metrics.
package metrics

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// Metrics holds the agent's collectors. Its methods are safe for concurrent use.
type Metrics struct {
	reg   *prometheus.Registry
	ready atomic.Bool
	noticeCollectors
	checkpointCollectors
	runCollectors
	trainers *trainerCollectors
	store    storeCollectors
}

// Phases are the checkpoint phases Phase is called with, pre-created so that
// their histograms exist (at zero) before the first checkpoint.
var Phases = []string{"save", "upload", "commit"}

// The labels pre-created at zero, so that dashboards and alerts see a 0
// rather than "No data" before the first event (#41 item 8):
// FailureReasons and Components are the fixed values pkg/supervisor passes
// to CommitFailed and Error (TestMetrics_LabelsPreCreated keeps them in
// step), NoticeKinds every notice kind, for the machine's cloud once
// Machine names it and for SIGTERM/SIGINT from the start.
var (
	FailureReasons = []string{"deadline", "trainer", "preempted"}
	Components     = []string{"checkpoint", "restore", "journal", "fenced", "peer_lost", "peer_silent"}
	NoticeKinds    = []string{"termination", "rebalance", "maintenance", "cancelled"}
)

// New registers every collector, the Go runtime's and the process's on a
// fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m := &Metrics{
		reg:                  reg,
		noticeCollectors:     newNoticeCollectors(reg),
		checkpointCollectors: newCheckpointCollectors(reg),
		runCollectors:        newRunCollectors(reg),
		trainers:             newTrainerCollectors(reg),
		store:                newStoreCollectors(reg),
	}
	m.RestoredFrom(nil) // local and store at 0 until a restore
	return m
}

// Machine labels the agent's series with its machine: the one
// spotagent_instance_info series carries cloud, instance type and zone
// (empty when the metadata does not say).
func (m *Metrics) Machine(cloud, instanceType, zone string) {
	m.instanceInfo.Reset()
	m.instanceInfo.WithLabelValues(cloud, instanceType, zone).Set(1)
	if cloud != "" && cloud != "none" {
		for _, k := range NoticeKinds {
			m.notices.WithLabelValues(cloud, k)
		}
	}
}

// NoticeCheckpoint records how an interruption's checkpoint ended:
// committed or not, took from the notice's detection to the commit (or
// the failure), and lead from the detection to the notice's deadline (0:
// the notice had none).
func (m *Metrics) NoticeCheckpoint(committed bool, took, lead time.Duration) {
	if committed {
		m.noticeCheckpoints.WithLabelValues("committed").Inc()
		m.noticeToCommitted.Observe(took.Seconds())
	} else {
		m.noticeCheckpoints.WithLabelValues("failed").Inc()
	}
	if lead > 0 {
		m.noticeLead.Observe(lead.Seconds())
	}
}

// NoticePromise exports the predicted notice checkpoint (request →
// committed) and, per cloud, its budget and whether it fits.
func (m *Metrics) NoticePromise(need time.Duration, budgets map[string]time.Duration) {
	m.noticePredicted.Set(need.Seconds())
	for cloud, b := range budgets {
		m.noticeBudget.WithLabelValues(cloud).Set(b.Seconds())
		fits := 0.0
		if need <= b {
			fits = 1
		}
		m.noticeFits.WithLabelValues(cloud).Set(fits)
	}
}

// Registry is the registry /metrics serves, for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Agent is m as the agent's measurements: m measures all three parts.
func (m *Metrics) Agent() supervisor.Metrics {
	return supervisor.Metrics{NoticeMetrics: m, CheckpointMetrics: m, RunMetrics: m}
}

// Notice counts one interruption notice.
func (m *Metrics) Notice(cloud, kind string) { m.notices.WithLabelValues(cloud, kind).Inc() }

// NoticeToRequest observes the latency from notice to checkpoint request.
func (m *Metrics) NoticeToRequest(d time.Duration) { m.noticeToRequest.Observe(d.Seconds()) }

// Phase observes one checkpoint phase: save, upload or commit.
func (m *Metrics) Phase(phase string, d time.Duration) {
	m.phase.WithLabelValues(phase).Observe(d.Seconds())
}

// Uploaded adds bytes to the upload total and sets the last throughput.
func (m *Metrics) Uploaded(bytes int64, d time.Duration) {
	m.uploadedBytes.Add(float64(bytes))
	if d > 0 {
		m.throughput.Set(float64(bytes) / d.Seconds())
	}
}

// Committed records the newest committed checkpoint.
func (m *Metrics) Committed(step int64, at time.Time) {
	m.lastStep.Set(float64(step))
	m.lastCommitted.Set(float64(at.UnixNano()) / 1e9)
	m.trainers.committed.Set(1)
	m.trainers.protectedAt.Store(at.UnixNano())
}

// Trainers sets the trainers connected, the newest step one reported and
// the checkpoint requests left unanswered past the agent's warning bound.
func (m *Metrics) Trainers(connected int, step int64, unanswered int) {
	m.trainers.connected.Set(float64(connected))
	m.trainers.step.Set(float64(step))
	m.trainers.unanswered.Set(float64(unanswered))
}

// CommitFailed counts a checkpoint that was not committed.
func (m *Metrics) CommitFailed(reason string) { m.commitFailures.WithLabelValues(reason).Inc() }

// Interval sets the current periodic interval.
func (m *Metrics) Interval(d time.Duration) { m.interval.Set(d.Seconds()) }

// Error counts an error in component.
func (m *Metrics) Error(component string) { m.errors.WithLabelValues(component).Inc() }

// Restored records the restore done at start.
func (m *Metrics) Restored(bytes int64, d time.Duration) {
	m.restoreBytes.Set(float64(bytes))
	m.restoreSeconds.Set(d.Seconds())
	m.trainers.committed.Set(1) // the run has a committed checkpoint: the restored one
}

// RestoredFrom records where the restore at start read its bytes
// (restore.Result.From): local, peer and store are always exported, at 0
// before any restore.
func (m *Metrics) RestoredFrom(from map[string]int64) {
	m.restoreFrom.Reset()
	m.restoreFrom.WithLabelValues(checkpoint.FromLocal).Set(0)
	m.restoreFrom.WithLabelValues(checkpoint.FromPeer).Set(0)
	m.restoreFrom.WithLabelValues(checkpoint.FromStore).Set(0)
	for s, n := range from {
		m.restoreFrom.WithLabelValues(s).Set(float64(n))
	}
}

// Goodput exports the run's goodput accounting (journal.Account).
func (m *Metrics) Goodput(g *journal.Goodput) {
	if g == nil {
		return
	}
	m.goodputRatio.Set(g.Ratio)
	for _, b := range journal.Buckets {
		m.goodputSeconds.WithLabelValues(b).Set(g.Seconds[b])
	}
}

// Ready sets what /readyz answers and the spotagent_ready gauge.
func (m *Metrics) Ready(ok bool) {
	m.ready.Store(ok)
	if ok {
		m.readyGauge.Set(1)
	} else {
		m.readyGauge.Set(0)
	}
}

// Handler serves /metrics, /healthz (200 while the process runs) and
// /readyz (200 after Ready(true), 503 before it and after Ready(false)).
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !m.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready\n"))
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
