package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// noticeCollectors are the notices, and what the agent promises and
// achieves on one (issues 29 and 30).
type noticeCollectors struct {
	notices           *prometheus.CounterVec
	noticeToRequest   prometheus.Histogram
	noticeCheckpoints *prometheus.CounterVec
	noticeToCommitted prometheus.Histogram
	noticeLead        prometheus.Histogram
	noticePredicted   prometheus.Gauge
	noticeBudget      *prometheus.GaugeVec
	noticeFits        *prometheus.GaugeVec
}

// newNoticeCollectors creates the collectors, registers them on reg and
// creates their fixed labels at zero.
func newNoticeCollectors(reg prometheus.Registerer) noticeCollectors {
	c := noticeCollectors{
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotagent_notices_total",
			Help: "Interruption notices seen, by cloud and kind.",
		}, []string{"cloud", "kind"}),
		noticeToRequest: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spotagent_notice_to_request_seconds",
			Help:    "Time from detecting a notice to sending the trainer its checkpoint request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms … ~4.4m
		}),
		noticeCheckpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotagent_notice_checkpoints_total",
			Help: "Interruption (notice) checkpoints by result: committed before the machine went, or failed (work since the previous checkpoint lost).",
		}, []string{"result"}),
		noticeToCommitted: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spotagent_notice_to_committed_seconds",
			Help:    "Time from detecting a notice to its checkpoint committed.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 12), // 0.5 s … ~17 min
		}),
		noticeLead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spotagent_notice_lead_seconds",
			Help:    "Time from detecting a notice to its deadline (the machine's end), for notices with a deadline.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 12),
		}),
		noticePredicted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_notice_checkpoint_predicted_seconds",
			Help: "Predicted time from a notice checkpoint's request to its commit, from the newest checkpoint's measured save and upload (0: nothing measured yet).",
		}),
		noticeBudget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotagent_notice_budget_seconds",
			Help: "Time a cloud's documented notice leaves for the checkpoint: the notice minus --margin.",
		}, []string{"cloud"}),
		noticeFits: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotagent_notice_checkpoint_fits",
			Help: "1 when the predicted notice checkpoint commits within the cloud's budget, else 0; absent before anything was measured.",
		}, []string{"cloud"}),
	}
	reg.MustRegister(c.notices, c.noticeToRequest, c.noticeCheckpoints, c.noticeToCommitted, c.noticeLead, c.noticePredicted, c.noticeBudget, c.noticeFits)
	for _, r := range []string{"committed", "failed"} {
		c.noticeCheckpoints.WithLabelValues(r)
	}
	c.notices.WithLabelValues("signal", "termination") // SIGTERM/SIGINT
	return c
}

// checkpointCollectors are the checkpoints: their phases, bytes, the
// newest committed, the interval, the failures.
type checkpointCollectors struct {
	phase          *prometheus.HistogramVec
	uploadedBytes  prometheus.Counter
	throughput     prometheus.Gauge
	lastStep       prometheus.Gauge
	lastCommitted  prometheus.Gauge
	interval       prometheus.Gauge
	commitFailures *prometheus.CounterVec
}

// newCheckpointCollectors creates the collectors, registers them on reg and
// creates their fixed labels at zero.
func newCheckpointCollectors(reg prometheus.Registerer) checkpointCollectors {
	c := checkpointCollectors{
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "spotagent_checkpoint_phase_seconds",
			Help:    "Duration of checkpoint phases: save (request to done), upload, commit (done to committed).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12), // 10ms … ~4m
		}, []string{"phase"}),
		uploadedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spotagent_uploaded_bytes_total",
			Help: "Bytes uploaded to the store by committed checkpoints.",
		}),
		throughput: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_upload_throughput_bytes_per_second",
			Help: "Throughput of the last upload.",
		}),
		lastStep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_last_committed_step",
			Help: "Training step of the newest committed checkpoint.",
		}),
		lastCommitted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_last_committed_timestamp_seconds",
			Help: "Unix time the newest checkpoint was committed; 0 before the first.",
		}),
		interval: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_checkpoint_interval_seconds",
			Help: "Current periodic checkpoint interval.",
		}),
		commitFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotagent_commit_failures_total",
			Help: "Checkpoints that were not committed, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(c.phase, c.uploadedBytes, c.throughput, c.lastStep, c.lastCommitted, c.interval, c.commitFailures)
	for _, p := range Phases {
		c.phase.WithLabelValues(p)
	}
	for _, r := range FailureReasons {
		c.commitFailures.WithLabelValues(r)
	}
	return c
}

// runCollectors are the run: its machine (issue 29), readiness, errors,
// the restore at start, goodput.
type runCollectors struct {
	instanceInfo   *prometheus.GaugeVec
	readyGauge     prometheus.Gauge
	errors         *prometheus.CounterVec
	restoreSeconds prometheus.Gauge
	restoreBytes   prometheus.Gauge
	restoreFrom    *prometheus.GaugeVec
	goodputRatio   prometheus.Gauge
	goodputSeconds *prometheus.GaugeVec
}

// newRunCollectors creates the collectors, registers them on reg and
// creates their fixed labels at zero.
func newRunCollectors(reg prometheus.Registerer) runCollectors {
	c := runCollectors{
		instanceInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotagent_instance_info",
			Help: "1, labelled with the machine the agent runs on: join it on instance to label any series by cloud, instance type and zone.",
		}, []string{"cloud", "instance_type", "zone"}),
		readyGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_ready",
			Help: "1 while the agent serves trainers (after restore, before shutdown).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotagent_errors_total",
			Help: "Errors by component.",
		}, []string{"component"}),
		restoreSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_restore_seconds",
			Help: "Duration of the restore at start; 0 when nothing was restored.",
		}),
		restoreBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_restore_bytes",
			Help: "Bytes restored at start.",
		}),
		restoreFrom: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotagent_restore_source_bytes",
			Help: "Bytes of the restore at start by where they came from: local (this machine's copy), peer (another node's copy) or store.",
		}, []string{"source"}),
		goodputRatio: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_goodput_ratio",
			Help: "Productive training time over the run's wall time, from the run journal (docs/goodput.md).",
		}),
		goodputSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotagent_goodput_seconds",
			Help: "The run's wall time by bucket: productive, blocked, lost, restore, between.",
		}, []string{"bucket"}),
	}
	reg.MustRegister(c.instanceInfo, c.readyGauge, c.errors, c.restoreSeconds, c.restoreBytes, c.restoreFrom, c.goodputRatio, c.goodputSeconds)
	for _, b := range journal.Buckets {
		c.goodputSeconds.WithLabelValues(b)
	}
	for _, comp := range Components {
		c.errors.WithLabelValues(comp)
	}
	return c
}

// trainerCollectors are what says a run is protected: its trainers
// connected, the step they reached, requests nobody answers, and how long
// since the last commit (issue: never silent).
type trainerCollectors struct {
	connected   prometheus.Gauge
	step        prometheus.Gauge
	unanswered  prometheus.Gauge
	committed   prometheus.Gauge
	protectedAt atomic.Int64 // Unix ns of the last commit, else of the agent's start
}

// newTrainerCollectors creates the collectors and registers them on reg;
// the time since the last commit counts from now until the first.
func newTrainerCollectors(reg prometheus.Registerer) *trainerCollectors {
	c := &trainerCollectors{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_trainers_connected",
			Help: "Trainers connected to the agent's socket (said hello). 0 while a trainer runs: it is not protected.",
		}),
		step: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_trainer_step",
			Help: "The newest training step a trainer reported (progress, done, bye).",
		}),
		unanswered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_checkpoint_requests_unanswered",
			Help: "Periodic checkpoint requests unanswered for longer than 2 intervals (at least 10 s): the trainer does not poll.",
		}),
		committed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotagent_checkpoint_committed",
			Help: "1 once the run has a committed checkpoint (this agent committed or restored one), else 0: an interruption would lose everything.",
		}),
	}
	c.protectedAt.Store(time.Now().UnixNano())
	since := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "spotagent_seconds_since_commit",
		Help: "Seconds since this agent last committed a checkpoint, or since it started when it has committed none.",
	}, func() float64 { return time.Since(time.Unix(0, c.protectedAt.Load())).Seconds() })
	reg.MustRegister(c.connected, c.step, c.unanswered, c.committed, since)
	return c
}
