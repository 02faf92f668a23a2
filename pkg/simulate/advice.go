package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spotagent/spotagent/internal/beta"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Advice from a run's own history (docs/goodput.md, "Advice"): the
// simulator, calibrated on the journal, replays candidate interval policies
// on traces drawn from the posterior of the run's interruption rate and
// notice success, and the policy with the least predicted waste is
// recommended. The margin is not simulated; its recommendation is a bound
// from the observed notice timings (MarginAdvice).

// AdviceConfig is what Advise compares and how long it simulates.
type AdviceConfig struct {
	Current   time.Duration // current --interval; 0 = auto
	Margin    time.Duration // current --margin (0: the default 5s; < 0: none)
	Min, Max  time.Duration // clamps of every policy
	PriorRate float64       // --interruption-rate
	Horizon   time.Duration // simulated run length (default 7 days)
	Runs      int           // simulated runs per policy (default 200)
	Seed      uint64        // first seed (default 1)
}

// Calibration is what the journal says about the run, as the simulator uses it.
type Calibration struct {
	RunHours        float64 `json:"run_hours"`        // time on machines, all sessions
	Interruptions   int     `json:"interruptions"`    // observed
	NoticeCommitted int     `json:"notice_committed"` // of which the notice checkpoint committed
	ObservedRate    float64 `json:"observed_rate_per_hour"`
	// Rate and NoticeSuccess are the posterior means (the scheduler's
	// priors updated with the journal); each simulated run draws its own
	// rate and notice success from the posteriors.
	Rate           float64 `json:"rate_per_hour"`
	NoticeSuccess  float64 `json:"notice_success"`
	DeltaSeconds   float64 `json:"delta_seconds"`
	UploadSeconds  float64 `json:"upload_seconds"`
	RestartSeconds float64 `json:"restart_seconds"`
	// Sources says where δ, upload and restart came from.
	Sources map[string]string `json:"sources"`
}

// AdvicePolicy is one candidate's prediction.
type AdvicePolicy struct {
	Policy   string  `json:"policy"` // adaptive or fixed:<interval>
	Flag     string  `json:"flag"`   // --interval value
	Waste    float64 `json:"waste_percent"`
	Goodput  float64 `json:"goodput_ratio"` // useful / (useful + waste), predicted
	Current  bool    `json:"current,omitempty"`
	Interval float64 `json:"interval_seconds,omitempty"` // fixed only
}

// MarginAdvice is the --margin recommendation and what it rests on.
type MarginAdvice struct {
	Current     float64 `json:"current_seconds"`
	Recommended float64 `json:"recommended_seconds"`
	Notices     int     `json:"notices_timed"` // notice checkpoints with full timings
	Failed      int     `json:"notices_failed"`
	MinLead     float64 `json:"min_lead_seconds,omitempty"`   // deadline − detection
	MaxSave     float64 `json:"max_save_seconds,omitempty"`   // detection → trainer done
	MaxUpload   float64 `json:"max_upload_seconds,omitempty"` // done → committed
	MaxOverrun  float64 `json:"max_upload_overrun_seconds"`   // upload − its estimate
	MinSlack    float64 `json:"min_slack_seconds,omitempty"`  // deadline − committed
	Room        float64 `json:"room_seconds,omitempty"`       // most margin the shortest lead allows
	Basis       string  `json:"basis"`
	Unavailable bool    `json:"unavailable,omitempty"` // no timed notice: nothing to go on
}

// Advice is the recommendation of Advise.
type Advice struct {
	Calibration     Calibration    `json:"calibration"`
	Runs            int            `json:"runs"`
	HorizonSeconds  float64        `json:"horizon_seconds"`
	Policies        []AdvicePolicy `json:"policies"`
	Recommended     string         `json:"recommended"` // policy
	RecommendedFlag string         `json:"recommended_flag"`
	Waste           float64        `json:"recommended_waste_percent"`
	CurrentWaste    float64        `json:"current_waste_percent"`
	// DiffSE is the standard error of (current − recommended) waste over
	// the paired simulated runs, percentage points.
	DiffSE float64      `json:"difference_se_percent"`
	Margin MarginAdvice `json:"margin"`
}

// adviceTolerance: adaptive is recommended unless a fixed interval beats
// it by more than this fraction (it also follows a rate that changes).
const adviceTolerance = 0.02

// Advise calibrates the simulator on j (and g, its accounting) and compares
// the candidate policies: adaptive, fixed 5m … 2h, Daly's interval for the
// posterior means, and the current setting.
func Advise(j *journal.Journal, g *journal.Goodput, c AdviceConfig) *Advice {
	if c.Horizon <= 0 {
		c.Horizon = 7 * 24 * time.Hour
	}
	if c.Runs <= 0 {
		c.Runs = 200
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Min <= 0 {
		c.Min = schedule.DefaultMinInterval
	}
	if c.Max <= 0 {
		c.Max = schedule.DefaultMaxInterval
	}
	if c.PriorRate <= 0 {
		c.PriorRate = schedule.DefaultInterruptionRate
	}
	switch {
	case c.Margin == 0:
		c.Margin = schedule.DefaultMargin
	case c.Margin < 0: // none (--margin 0s)
		c.Margin = 0
	}
	cal, hist := calibrate(j, g, c.PriorRate)
	a := &Advice{Calibration: cal, Runs: c.Runs, HorizonSeconds: c.Horizon.Seconds()}
	a.Margin = adviseMargin(j, c.Margin)

	delta := secondsDur(cal.DeltaSeconds)
	upload := secondsDur(cal.UploadSeconds)
	p := Params{Delta: delta, Upload: upload, Restart: secondsDur(cal.RestartSeconds), Duration: c.Horizon,
		Min: c.Min, Max: c.Max, PriorRate: c.PriorRate, History: hist}

	// Candidates.
	var fixed []time.Duration
	for _, d := range []time.Duration{5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour} {
		fixed = append(fixed, d)
	}
	daly := c.Max
	if u := cal.Rate * (1 - cal.NoticeSuccess); u > 0 {
		daly = schedule.DalyInterval(delta, time.Duration(float64(time.Hour)/u))
	}
	fixed = append(fixed, min(max(daly, c.Min, upload), c.Max).Round(time.Minute))
	if c.Current > 0 {
		fixed = append(fixed, c.Current)
	}
	slices.Sort(fixed)
	fixed = slices.Compact(fixed)
	pols := []Policy{{Name: "adaptive"}}
	for _, d := range fixed {
		if d >= c.Min && d <= c.Max || d == c.Current {
			pols = append(pols, Policy{Name: "fixed:" + fmtDur(d), Fixed: d})
		}
	}

	// Traces: each run draws λ and p from their posteriors (common to
	// every policy: paired comparison).
	w := schedule.PriorWeight.Hours()
	shape, rate := c.PriorRate*w+float64(cal.Interruptions), w+cal.RunHours
	traces := make([][]Event, c.Runs)
	for i := range traces {
		rng := rand.New(rand.NewPCG(c.Seed+uint64(i), 0xad71ce))
		lam := beta.Gamma(rng, shape) / rate
		ps := schedule.NoticeMix().Draw(rng, cal.NoticeCommitted, cal.Interruptions-cal.NoticeCommitted)
		traces[i] = SyntheticTrace(SynthConfig{Rate: lam, Duration: c.Horizon, NoticeSuccess: ps,
			Lead: Lead(delta, upload), Seed: c.Seed + uint64(i)})
	}
	perRun := make([][]float64, len(pols))
	best, cur := -1, -1
	for k, pol := range pols {
		var sum Result
		perRun[k] = make([]float64, len(traces))
		for i, tr := range traces {
			r := Simulate(tr, pol, p)
			perRun[k][i] = r.Waste()
			sum.Add(r)
		}
		ap := AdvicePolicy{Policy: pol.Name, Flag: "auto", Waste: sum.Waste()}
		ap.Goodput = 1 / (1 + ap.Waste/100)
		if pol.Fixed > 0 {
			ap.Flag, ap.Interval = fmtDur(pol.Fixed), pol.Fixed.Seconds()
		}
		if pol.Fixed == c.Current {
			ap.Current, cur = true, k
		}
		if best < 0 || ap.Waste < a.Policies[best].Waste {
			best = k
		}
		a.Policies = append(a.Policies, ap)
	}
	rec := best
	if a.Policies[0].Waste <= (1+adviceTolerance)*a.Policies[best].Waste {
		rec = 0
	}
	a.Recommended, a.RecommendedFlag = a.Policies[rec].Policy, a.Policies[rec].Flag
	a.Waste, a.CurrentWaste = a.Policies[rec].Waste, a.Policies[cur].Waste
	a.DiffSE = pairedSE(perRun[cur], perRun[rec])
	return a
}

// calibrate reads the simulator's inputs from the journal, and the history
// the adaptive policy starts from (what a restarted agent would read).
func calibrate(j *journal.Journal, g *journal.Goodput, prior float64) (Calibration, schedule.History) {
	cal := Calibration{Sources: map[string]string{}}
	runSec := j.Stats.RunSeconds
	if runSec <= 0 && g != nil {
		runSec = g.Seconds[journal.BucketProductive] + g.Seconds[journal.BucketBlocked] + g.Seconds[journal.BucketLost] + g.Seconds[journal.BucketRestore]
	}
	cal.RunHours = runSec / 3600
	if g != nil {
		cal.Interruptions, cal.NoticeCommitted = g.Interruptions, g.NoticeCommits
	} else {
		cal.Interruptions = len(j.Interruptions)
		for _, in := range j.Interruptions {
			if in.CommitOK {
				cal.NoticeCommitted++
			}
		}
	}
	if cal.RunHours > 0 {
		cal.ObservedRate = float64(cal.Interruptions) / cal.RunHours
	}
	w := schedule.PriorWeight.Hours()
	cal.Rate = (prior*w + float64(cal.Interruptions)) / (w + cal.RunHours)
	cal.NoticeSuccess = schedule.NoticeMean(cal.NoticeCommitted, cal.Interruptions-cal.NoticeCommitted)

	// δ: blocked seconds per checkpoint.
	var blocked float64
	var timed bool
	for _, s := range j.Sessions {
		if s.BlockedSeconds != nil {
			blocked += *s.BlockedSeconds
			timed = true
		}
	}
	switch n := j.Stats.Checkpoints + j.Stats.Failures; {
	case timed && n > 0 && blocked > 0:
		cal.DeltaSeconds, cal.Sources["delta"] = blocked/float64(n), fmt.Sprintf("journal: %.3g s blocked over %d checkpoint(s)", blocked, n)
	case j.Stats.CostSeconds > 0:
		cal.DeltaSeconds, cal.Sources["delta"] = j.Stats.CostSeconds, "journal: stats.cost_seconds"
	default:
		cal.DeltaSeconds, cal.Sources["delta"] = schedule.DefaultCost.Seconds(), "default (no checkpoint timed)"
	}
	// Upload: the newest checkpoint's size at the measured throughput.
	var ups []float64
	for _, in := range j.Interruptions {
		if in.Done != nil && in.Committed != nil && in.Committed.After(*in.Done) {
			ups = append(ups, in.Committed.Sub(*in.Done).Seconds())
		}
	}
	switch {
	case j.Stats.LastBytes > 0 && j.Stats.BytesPerSec > 0:
		cal.UploadSeconds = float64(j.Stats.LastBytes) / j.Stats.BytesPerSec
		cal.Sources["upload"] = fmt.Sprintf("journal: %d bytes at %.3g bytes/s", j.Stats.LastBytes, j.Stats.BytesPerSec)
	case len(ups) > 0:
		cal.UploadSeconds, cal.Sources["upload"] = mean(ups), "journal: notice checkpoints' done → committed"
	default:
		cal.UploadSeconds, cal.Sources["upload"] = time.Minute.Seconds(), "default (no upload measured)"
	}
	// Restart: from the end of an interrupted machine (its deadline, or the
	// detection) to the next session's start, plus that session's restores.
	var rs []float64
	sess := slices.Clone(j.Sessions)
	slices.SortStableFunc(sess, func(a, b journal.Session) int { return a.Start.Compare(b.Start) })
	for _, in := range j.Interruptions {
		end := in.Detected
		if in.Deadline != nil && in.Deadline.After(end) {
			end = *in.Deadline
		}
		for k, s := range sess {
			if !s.Start.After(in.Detected) {
				continue
			}
			next := time.Time{}
			if k+1 < len(sess) {
				next = sess[k+1].Start
			}
			r := max(s.Start.Sub(end).Seconds(), 0)
			for _, re := range j.Restores {
				if !re.At.Before(s.Start) && (next.IsZero() || re.At.Before(next)) {
					r += re.Seconds
				}
			}
			rs = append(rs, r)
			break
		}
	}
	if len(rs) > 0 {
		cal.RestartSeconds = mean(rs)
		cal.Sources["restart"] = fmt.Sprintf("journal: %d interruption(s) → next session's start + restore", len(rs))
	} else {
		cal.RestartSeconds, cal.Sources["restart"] = (5 * time.Minute).Seconds(), "default (no restart observed)"
	}
	h := schedule.History{RunTime: secondsDur(runSec), Interruptions: cal.Interruptions, NoticeCommitted: cal.NoticeCommitted,
		Cost: secondsDur(j.Stats.CostSeconds), Throughput: j.Stats.BytesPerSec}
	return cal, h
}

// adviseMargin bounds --margin from the notice checkpoints' timings. The
// agent asks the trainer to finish saving by deadline − expected upload −
// margin, and gives the upload until deadline − margin/2: the margin must
// cover twice the worst overrun of an upload over its estimate, and cannot
// exceed what the shortest lead leaves after the save and the upload.
func adviseMargin(j *journal.Journal, cur time.Duration) MarginAdvice {
	m := MarginAdvice{Current: cur.Seconds(), Recommended: cur.Seconds()}
	bps := j.Stats.BytesPerSec
	room := math.Inf(1)
	for _, in := range j.Interruptions {
		if in.Deadline == nil || !in.Deadline.After(in.Detected) {
			continue
		}
		if !in.CommitOK {
			m.Failed++
			continue
		}
		if in.Done == nil || in.Committed == nil {
			continue
		}
		lead := in.Deadline.Sub(in.Detected).Seconds()
		save := max(in.Done.Sub(in.Detected).Seconds(), 0)
		up := max(in.Committed.Sub(*in.Done).Seconds(), 0)
		slack := in.Deadline.Sub(*in.Committed).Seconds()
		est := up
		if bps > 0 && in.Bytes > 0 {
			est = float64(in.Bytes) / bps
		}
		if m.Notices == 0 || lead < m.MinLead {
			m.MinLead = lead
		}
		if m.Notices == 0 || slack < m.MinSlack {
			m.MinSlack = slack
		}
		m.Notices++
		m.MaxSave, m.MaxUpload = max(m.MaxSave, save), max(m.MaxUpload, up)
		m.MaxOverrun = max(m.MaxOverrun, up-est)
		room = min(room, lead-save-est)
	}
	if m.Notices == 0 {
		m.Unavailable = true
		m.Basis = "no notice checkpoint with a deadline and timings in the journal: keep the current margin"
		if m.Failed > 0 {
			m.Basis = fmt.Sprintf("%d notice checkpoint(s) failed and none committed: no margin makes a lead shorter than save + upload fit; keep the current margin, the interval covers these losses", m.Failed)
		}
		return m
	}
	m.Room = max(room, 0)
	need := math.Ceil(max(schedule.DefaultMargin.Seconds(), 2*m.MaxOverrun))
	m.Recommended = need
	m.Basis = fmt.Sprintf("%d committed notice(s): worst upload overrun over its estimate %.1f s, so a margin ≥ max(5 s, 2 × overrun) = %.0f s; the shortest lead (%.0f s) leaves %.0f s after save and upload",
		m.Notices, m.MaxOverrun, need, m.MinLead, m.Room)
	if need > m.Room {
		m.Recommended = math.Floor(m.Room)
		m.Basis += "; the margin is capped there (a larger one would cut the save short)"
	}
	if m.Failed > 0 {
		m.Basis += fmt.Sprintf("; %d notice checkpoint(s) failed", m.Failed)
	}
	return m
}

func pairedSE(a, b []float64) float64 {
	n := len(a)
	if n < 2 {
		return 0
	}
	d := make([]float64, n)
	for i := range a {
		d[i] = a[i] - b[i]
	}
	mu := mean(d)
	var ss float64
	for _, x := range d {
		if !math.IsInf(x, 0) && !math.IsNaN(x) {
			ss += (x - mu) * (x - mu)
		}
	}
	return math.Sqrt(ss / float64(n-1) / float64(n))
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func secondsDur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
