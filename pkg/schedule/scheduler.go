// Package schedule decides when to checkpoint: the adaptive (Young/Daly)
// interval from the measured cost, throughput and interruption rate (the
// run's journal, live hazards such as rebalance or maintenance notices),
// the regret model of notices that may not commit in time, and the margin
// kept before a notice's deadline. It uses no storage code.
package schedule

// When to checkpoint: the Scheduler (the adaptive interval, live hazards,
// the notice margin), and a notice checkpoint's time and whether it fits
// each cloud's notice (Estimate).

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults of SchedulerConfig and of the estimates before any measurement.
const (
	DefaultMinInterval      = time.Minute
	DefaultMaxInterval      = 2 * time.Hour
	DefaultInterruptionRate = 0.05 // per hour

	// DefaultCost is the blocking cost assumed before the first checkpoint.
	DefaultCost = 30 * time.Second
	// defaultThroughput (bytes/s) sizes uploads before the first one is measured.
	defaultThroughput = 50e6
	// defaultRebalanceFactor multiplies the interruption rate after a
	// rebalance recommendation (or a maintenance event without a time).
	defaultRebalanceFactor = 10.0
	// defaultHazardDecay is the time constant with which a raised hazard
	// without an end decays back to the base rate.
	defaultHazardDecay = 2 * time.Hour
	// DefaultMargin is the safety margin kept before a notice deadline
	// (--margin, supervisor.Config.Margin); the simulator's advice never
	// recommends less.
	DefaultMargin = 5 * time.Second

	// priorWeight is how much run time the rate prior is worth: a gamma
	// prior with shape rate·priorWeight and inverse scale priorWeight.
	priorWeight = 24 * time.Hour
	// costAlpha and uploadAlpha weight a new sample in the EWMAs.
	costAlpha, uploadAlpha = 0.3, 0.3
	// uploadPoll is how far ahead Next looks while an upload is running;
	// callers should also re-ask as soon as the upload finishes.
	uploadPoll = 5 * time.Second
	// maxMTTL caps M when p → 1 or the rate → 0.
	maxMTTL = 10 * 365 * 24 * time.Hour
)

// SchedulerConfig configures a Scheduler. Zero values take the defaults.
type SchedulerConfig struct {
	// Fixed > 0 fixes the interval (--interval 15m) and ignores every
	// estimate and live signal; 0 is adaptive (--interval auto).
	Fixed time.Duration
	// Min and Max clamp the adaptive interval (defaults 1m, 2h).
	Min, Max time.Duration
	// InterruptionRate is the prior rate of interruptions (announced or not)
	// per hour of run time (default 0.05).
	InterruptionRate float64
	// RebalanceFactor multiplies the rate while a rebalance signal is live
	// (default 10).
	RebalanceFactor float64
	Log             *zap.Logger
}

// History is what the run journal tells a (re)started run about earlier
// lives of the same run.
type History struct {
	RunTime         time.Duration // time the run spent on machines, all lives together
	Interruptions   int           // interruptions observed, announced or not
	NoticeCommitted int           // interruptions whose notice-driven checkpoint committed
	Cost            time.Duration // last blocking-cost EWMA; 0 = unknown
	Throughput      float64       // last upload throughput EWMA, bytes/s; 0 = unknown
}

// Scheduler decides when the next periodic checkpoint is due. It never reads
// the clock: every decision takes now, so a simulation can drive it in
// simulated time. All methods are safe for concurrent use.
//
// The interval is Daly's estimate (DalyInterval) for the blocking cost δ and
// M, the mean time to an unannounced loss, M = 1/u_eff. u_eff is the rate of
// unannounced losses λ·(1−p) averaged over the posteriors of λ (gamma: prior
// InterruptionRate worth one day of run time, plus the journal's
// interruptions and run time, plus the time this scheduler has run without
// one; times any live hazard factor) and of p, the fraction of
// interruptions whose notice checkpoint committed (a Beta mixture), weighted
// to minimise the expected waste relative to the best achievable (regret.go).
// An interruption whose notice checkpoint committed raises p; one that lost
// work lowers it, and both raise λ.
// The result is clamped to [Min, Max] and raised to at least the expected
// upload time, so that uploads never pile up.
type Scheduler struct {
	cfg SchedulerConfig
	log *zap.Logger

	mu         sync.Mutex
	hist       History
	cost       time.Duration // EWMA; 0 = none measured
	throughput float64       // EWMA bytes/s; 0 = none measured
	lastBytes  int64         // size of the last upload
	uploadTime time.Duration // EWMA of upload durations, for bytes-less estimates
	start      time.Time     // first now seen: exposure of this life starts here
	now        time.Time     // latest now seen
	hazardAt   time.Time     // when the live hazard was raised; zero = none
	hazardEnd  time.Time     // when it ends; zero = decays from hazardAt
	maintAt    time.Time     // scheduled maintenance start; zero = none
	logged     time.Duration // last interval logged (at either level)
	loggedInfo time.Duration // last interval logged at info; 0 = none
	quiet      bool          // Quiet: interval changes at debug only
	regretKey  regretKey     // inputs of regretRate
	regretRate float64       // cached u_eff per hour
	regretOK   bool
}

// PriorRate is the flat prior rate of interruptions per hour the scheduler
// was configured with (--interruption-rate).
func (s *Scheduler) PriorRate() float64 { return s.cfg.InterruptionRate }

// NewScheduler returns a Scheduler with cfg's zero values defaulted.
func NewScheduler(cfg SchedulerConfig) *Scheduler {
	if cfg.Min <= 0 {
		cfg.Min = DefaultMinInterval
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultMaxInterval
	}
	if cfg.Max < cfg.Min {
		cfg.Max = cfg.Min
	}
	if cfg.InterruptionRate < 0 {
		cfg.InterruptionRate = 0
	} else if cfg.InterruptionRate == 0 {
		cfg.InterruptionRate = DefaultInterruptionRate
	}
	if cfg.RebalanceFactor < 1 {
		cfg.RebalanceFactor = defaultRebalanceFactor
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Scheduler{cfg: cfg, log: log}
}

// ObserveCost records the blocking cost of one checkpoint (request → done).
func (s *Scheduler) ObserveCost(d time.Duration) {
	if d < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cost == 0 {
		s.cost = d
	} else {
		s.cost = ewma(s.cost, d, costAlpha)
	}
}

// ObserveUpload records one upload's duration and size.
func (s *Scheduler) ObserveUpload(d time.Duration, bytes int64) {
	if d < 0 || bytes < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastBytes = bytes
	if s.uploadTime == 0 {
		s.uploadTime = d
	} else {
		s.uploadTime = ewma(s.uploadTime, d, uploadAlpha)
	}
	if d == 0 || bytes == 0 {
		return
	}
	bps := float64(bytes) / d.Seconds()
	if s.throughput == 0 {
		s.throughput = bps
	} else {
		s.throughput += uploadAlpha * (bps - s.throughput)
	}
}

// ObserveHistory seeds the scheduler from the run journal at start. The
// journal's cost and throughput are used until this life measures its own.
func (s *Scheduler) ObserveHistory(h History) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.RunTime < 0 {
		h.RunTime = 0
	}
	h.Interruptions = max(h.Interruptions, 0)
	h.NoticeCommitted = min(max(h.NoticeCommitted, 0), h.Interruptions)
	s.hist = h
	if s.cost == 0 && h.Cost > 0 {
		s.cost = h.Cost
	}
	if s.throughput == 0 && h.Throughput > 0 {
		s.throughput = h.Throughput
	}
}

// Hazard applies a live signal. "rebalance" (and "maintenance" without a
// time) multiplies the interruption rate by RebalanceFactor at once, until
// until, or when until is zero decaying back with a 2 h time constant.
// "maintenance" with a time makes the next checkpoint commit before it.
// "cancelled" withdraws a maintenance signal. Other kinds are ignored.
func (s *Scheduler) Hazard(now time.Time, kind string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.see(now)
	switch kind {
	case "rebalance":
		s.hazardAt, s.hazardEnd = now, until
	case "maintenance":
		if until.IsZero() {
			s.hazardAt, s.hazardEnd = now, time.Time{}
		} else {
			s.maintAt = until
		}
	case "cancelled":
		s.maintAt = time.Time{}
	default:
		return
	}
	s.log.Info("checkpoint hazard signal", zap.String("kind", kind), zap.Time("until", until))
	s.intervalLocked()
}

// Interval returns the current interval: the compute time from the end of
// one checkpoint (the trainer's done) to the next request, as of the latest
// now the scheduler was given. Every change is logged with its inputs.
func (s *Scheduler) Interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.intervalLocked()
}

// Next returns when the next periodic checkpoint is due, given last, when
// the previous checkpoint finished blocking (or when the run started or was
// restored). It is last + Interval, brought forward so that a checkpoint
// commits before a scheduled maintenance. While an upload is running no new
// checkpoint is due: Next then returns a time after now (now + 5 s at the
// earliest), and the caller re-asks then or when the upload finishes.
func (s *Scheduler) Next(last time.Time, uploading bool, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.see(now)
	due := last.Add(s.intervalLocked())
	if s.cfg.Fixed <= 0 && !s.maintAt.IsZero() {
		if now.After(s.maintAt) {
			s.maintAt = time.Time{}
		} else if t := s.maintAt.Add(-s.commitTimeLocked()); last.Before(t) && t.Before(due) {
			due = t
		}
	}
	if uploading && due.Before(now.Add(uploadPoll)) {
		due = now.Add(uploadPoll)
	}
	return due
}

// Due reports whether a periodic checkpoint should be requested now.
func (s *Scheduler) Due(now, last time.Time, uploading bool) bool {
	return !uploading && !s.Next(last, false, now).After(now)
}

// Cost returns the blocking-cost estimate (DefaultCost before any).
func (s *Scheduler) Cost() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.costLocked()
}

// Throughput returns the upload throughput estimate in bytes/s
// (defaultThroughput before any measurement).
func (s *Scheduler) Throughput() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.throughput == 0 {
		return defaultThroughput
	}
	return s.throughput
}

// EstimateUpload returns how long uploading bytes is expected to take.
func (s *Scheduler) EstimateUpload(bytes int64) time.Duration {
	return transferTime(bytes, s.Throughput())
}

// transferTime is how long moving bytes takes at bps bytes/s.
func transferTime(bytes int64, bps float64) time.Duration {
	return time.Duration(float64(bytes) / bps * float64(time.Second))
}

// see advances the scheduler's notion of now; the first call starts the
// exposure of this life.
func (s *Scheduler) see(now time.Time) {
	if s.start.IsZero() {
		s.start = now
	}
	if now.After(s.now) {
		s.now = now
	}
}

func (s *Scheduler) costLocked() time.Duration {
	if s.cost == 0 {
		return DefaultCost
	}
	return s.cost
}

// uploadLocked is the expected time of the next upload: the last size at
// the measured throughput, or the mean measured duration.
func (s *Scheduler) uploadLocked() time.Duration {
	if s.lastBytes > 0 && s.throughput > 0 {
		return transferTime(s.lastBytes, s.throughput)
	}
	return s.uploadTime
}

// commitTimeLocked is how long a checkpoint takes from request to commit.
func (s *Scheduler) commitTimeLocked() time.Duration {
	return s.costLocked() + s.uploadLocked()
}

// rateLocked returns the posterior interruption rate per hour, without the
// live hazard factor, and the exposure it is based on.
func (s *Scheduler) rateLocked() (float64, time.Duration) {
	// This life's exposure counts in whole hours, so that it changes the
	// interval (and logs) at most once an hour.
	exposure := s.hist.RunTime
	if !s.start.IsZero() {
		exposure += s.now.Sub(s.start).Truncate(time.Hour)
	}
	w := priorWeight.Hours()
	return (s.cfg.InterruptionRate*w + float64(s.hist.Interruptions)) / (w + exposure.Hours()), exposure
}

// noticeLocked returns the posterior fraction of interruptions whose
// notice checkpoint committed.
func (s *Scheduler) noticeLocked() float64 {
	return noticeMean(s.hist.NoticeCommitted, s.hist.Interruptions-s.hist.NoticeCommitted)
}

// hazardLocked returns the live factor on the rate.
func (s *Scheduler) hazardLocked() float64 {
	if s.hazardAt.IsZero() {
		return 1
	}
	k := s.cfg.RebalanceFactor
	if !s.hazardEnd.IsZero() {
		if s.now.Before(s.hazardEnd) {
			return k
		}
		return 1
	}
	return 1 + (k-1)*math.Exp(-s.now.Sub(s.hazardAt).Seconds()/defaultHazardDecay.Seconds())
}

func (s *Scheduler) intervalLocked() time.Duration {
	if s.cfg.Fixed > 0 {
		return s.cfg.Fixed
	}
	base, exposure := s.rateLocked()
	factor := s.hazardLocked()
	p := s.noticeLocked()
	rate := s.lossRateLocked(exposure, factor)
	m := maxMTTL
	if rate > 0 && 1/rate < maxMTTL.Hours() {
		m = time.Duration(float64(time.Hour) / rate)
	}
	delta := s.costLocked()
	upload := s.uploadLocked()
	iv := min(max(DalyInterval(delta, m), s.cfg.Min), s.cfg.Max)
	iv = max(iv, upload).Round(time.Second)
	if iv != s.logged {
		s.logIntervalLocked(iv, delta, m, base, factor, p, exposure, upload)
	}
	return iv
}

// meaningfulChange is the relative change of the interval logged at info;
// smaller ones (each commit's cost and upload samples move it by seconds)
// are logged at debug.
const meaningfulChange = 0.1

// logIntervalLocked logs a new interval with its inputs, in the units the
// field names carry, rounded: at info when it moved by meaningfulChange or
// more since the last info line, else (or when Quiet) at debug.
func (s *Scheduler) logIntervalLocked(iv, cost, mttl time.Duration, rate, factor, notice float64, exposure, upload time.Duration) {
	s.logged = iv
	level := zapcore.DebugLevel
	if !s.quiet && (s.loggedInfo == 0 || math.Abs(float64(iv-s.loggedInfo)) >= meaningfulChange*float64(s.loggedInfo)) {
		level, s.loggedInfo = zapcore.InfoLevel, iv
	}
	ce := s.log.Check(level, "checkpoint interval")
	if ce == nil {
		return
	}
	ce.Write(
		zap.Float64("interval_s", roundTo(iv.Seconds(), 0)),
		zap.Float64("cost_s", roundTo(cost.Seconds(), 1)),
		zap.Float64("mttl_h", roundTo(mttl.Hours(), 1)),
		zap.Float64("rate_per_h", roundTo(rate, 4)),
		zap.Float64("hazard_factor", roundTo(factor, 2)),
		zap.Float64("notice_committed", roundTo(notice, 2)),
		zap.Float64("exposure_h", roundTo(exposure.Hours(), 1)),
		zap.Int("interruptions", s.hist.Interruptions),
		zap.Float64("upload_s", roundTo(upload.Seconds(), 1)),
		zap.Float64("min_s", roundTo(s.cfg.Min.Seconds(), 0)),
		zap.Float64("max_s", roundTo(s.cfg.Max.Seconds(), 0)))
}

// roundTo rounds x to decimals places, for log fields a person reads.
func roundTo(x float64, decimals int) float64 {
	p := math.Pow10(decimals)
	return math.Round(x*p) / p
}

// Quiet logs the interval's changes at debug only: for an agent that never
// asks for checkpoints (zero-code mode), whose interval nobody acts on.
func (s *Scheduler) Quiet() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.quiet = true
}

// lossRateLocked returns u_eff, the effective rate of unannounced losses per
// hour that sets the interval (regret.go), cached while its inputs stay.
func (s *Scheduler) lossRateLocked(exposure time.Duration, factor float64) float64 {
	w := priorWeight.Hours()
	k := regretKey{
		// Whole hours of exposure, so that lives and runs share cache entries.
		a: s.cfg.InterruptionRate*w + float64(s.hist.Interruptions), b: w + exposure.Truncate(time.Hour).Hours(),
		committed: s.hist.NoticeCommitted, lost: s.hist.Interruptions - s.hist.NoticeCommitted,
		factor: factor, delta: s.costLocked(), min: s.cfg.Min, maxI: s.cfg.Max,
	}
	if k.delta <= 0 {
		return k.a / k.b * factor * (1 - s.noticeLocked())
	}
	if k != s.regretKey || !s.regretOK {
		s.regretKey, s.regretRate, s.regretOK = k, effectiveLossRate(k), true
	}
	return s.regretRate
}

func ewma(old, sample time.Duration, alpha float64) time.Duration {
	return old + time.Duration(alpha*float64(sample-old))
}

// CloudNotice is the time a cloud documents between its interruption
// notice and the machine's end (docs/operations.md cites each).
type CloudNotice struct {
	Cloud string // metadata.Cloud: aws, gcp, azure
	Name  string // how a message names it
	Lead  time.Duration
}

// CloudNotices are the clouds' documented notices: AWS's two-minute Spot
// interruption warning, GCP's 30 s preemption notice (ACPI soft off, then
// hard off), Azure's Preempt scheduled event (at least 30 s ahead).
var CloudNotices = []CloudNotice{
	{Cloud: "aws", Name: "AWS spot", Lead: 120 * time.Second},
	{Cloud: "gcp", Name: "GCP preemption", Lead: 30 * time.Second},
	{Cloud: "azure", Name: "Azure Preempt", Lead: 30 * time.Second},
}

// Estimate is how long a notice checkpoint would take from the request to
// its commit, from what was measured last (a periodic checkpoint of this
// session, or the journal of an earlier one). What the agent promises,
// whether that fits each cloud's notice, is pkg/supervisor/promise's.
type Estimate struct {
	Bytes int64 // the checkpoint's size
	// Save is the trainer's save (request → done); Upload the data upload
	// (for a pipelined save, from the first early upload); Took the whole
	// request → committed. Zero when unknown.
	Save, Upload, Took time.Duration
	// Rate is the upload rate, bytes/s (0: unknown).
	Rate float64
	// Pipelined: the trainer reported files with `saved`, so the upload
	// overlapped the save.
	Pipelined bool
	// Source says where the figures come from: "checkpoint" (this
	// session's newest), "journal" (an earlier session's), "restore" (only
	// the restored size and the restore's rate: a lower bound).
	Source string
	// Lower: Need is a lower bound (the save and the upload rate were not
	// measured; the restore's download rate stands in for the upload's).
	Lower bool
}

// Known reports whether p holds a prediction.
func (p Estimate) Known() bool { return p.Need() > 0 }

// Need is the predicted time from a notice's checkpoint request to its
// commit: the measured request → committed when there is one, else the
// save and the upload, overlapped when the save was pipelined.
func (p Estimate) Need() time.Duration {
	if p.Took > 0 {
		return p.Took
	}
	if p.Pipelined {
		return max(p.Save, p.Upload)
	}
	return p.Save + p.Upload
}

// Budget is the time a notice of lead leaves for the checkpoint: the
// agent keeps margin before the deadline.
func Budget(lead, margin time.Duration) time.Duration { return max(lead-margin, 0) }

// Fits reports whether a notice checkpoint commits within lead, margin kept.
func (p Estimate) Fits(lead, margin time.Duration) bool {
	return p.Need() <= Budget(lead, margin)
}

// NoticeFor returns the documented notice of cloud (false: none known,
// such as --cloud none or a SIGTERM-only run).
func NoticeFor(cloud string) (CloudNotice, bool) {
	for _, c := range CloudNotices {
		if c.Cloud == cloud {
			return c, true
		}
	}
	return CloudNotice{}, false
}

// Problem says why a notice checkpoint does not commit within c's notice,
// e.g. "checkpoint 80.0 GiB needs ~95s at 860 MB/s (save 12s); GCP
// preemption gives 30s (25s with --margin 5s)"; "" when it fits or
// nothing is known.
func (p Estimate) Problem(c CloudNotice, margin time.Duration) string {
	if !p.Known() || p.Fits(c.Lead, margin) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint %s needs ", HumanBytes(p.Bytes))
	if p.Lower {
		b.WriteString("at least ")
	} else {
		b.WriteString("~")
	}
	fmt.Fprintf(&b, "%s", RoundSeconds(p.Need()))
	var parts []string
	if p.Rate > 0 {
		parts = append(parts, "at "+Rate(p.Rate))
	}
	if p.Save > 0 {
		parts = append(parts, fmt.Sprintf("save %s", RoundSeconds(p.Save)))
	}
	if len(parts) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "; %s gives %s (%s with --margin %s)", c.Name, RoundSeconds(c.Lead), RoundSeconds(Budget(c.Lead, margin)), margin)
	return b.String()
}

// Advice lists what would make a notice checkpoint fit within budget:
// a pipelined save, fewer bytes, more frequent periodic checkpoints.
func (p Estimate) Advice(budget time.Duration) []string {
	var out []string
	if !p.Pipelined && p.Save > 0 && p.Upload > 0 {
		piped := max(p.Save, p.Upload)
		verdict := "would still not fit"
		if piped <= budget {
			verdict = "would fit"
		}
		out = append(out, fmt.Sprintf("report each file with `saved` as it is written (spotagent.torch.save, or req.saved(name)): the upload overlaps the save, ~%s, %s", RoundSeconds(piped), verdict))
	}
	if p.Rate > 0 && p.Bytes > 0 {
		left := budget
		if !p.Pipelined {
			left -= p.Save
		}
		if left > 0 {
			fit := int64(p.Rate * left.Seconds())
			if fit < p.Bytes {
				out = append(out, fmt.Sprintf("save fewer bytes: at %s about %s fits (e.g. the model without the optimizer state, or lower precision)", Rate(p.Rate), HumanBytes(fit)))
			}
		} else {
			out = append(out, "save faster: the trainer's save alone takes longer than the notice leaves")
		}
	}
	out = append(out, "checkpoint more often (a shorter --interval): the notice checkpoint may not commit, and what was trained since the last periodic checkpoint is then lost")
	return out
}

// HumanBytes prints n in binary units: 1.5 GiB, 640 MiB, 12 KiB, 3 B.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// RoundSeconds rounds d for a message: whole seconds from 10 s, tenths
// from 1 s, milliseconds below.
func RoundSeconds(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// Rate prints a rate in bytes/s as MB/s with two significant digits
// below 10 MB/s.
func Rate(bps float64) string {
	v := bps / 1e6
	switch {
	case v < 1:
		return fmt.Sprintf("%.2f MB/s", v)
	case v < 10:
		return fmt.Sprintf("%.1f MB/s", v)
	}
	return fmt.Sprintf("%.0f MB/s", v)
}
