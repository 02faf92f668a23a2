// Package promise is the deadline the agent can promise (issue 30, item
// 5): whether a notice checkpoint, as the newest measurements predict it,
// commits within each cloud's notice, --margin kept; said in the log, the
// metrics, `spotagent status` and `spotagent report`.
package promise

import (
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// The deadline the agent can promise (issue 30, item 5): from the newest
// checkpoint's measured save, upload and commit, whether a notice
// checkpoint commits within each cloud's notice, --margin kept. It is
// said at start (from the journal of an earlier session) and after each
// checkpoint when the verdict for this machine's notice changes: one
// warning when it stops fitting, one line when it fits again.

// State is the newest prediction and what was last said about it.
type State struct {
	p      schedule.Estimate
	misfit bool // the last verdict logged for this machine's notice was "does not fit"
	cfg    Env
}

// Env is what the prediction needs of the agent's Config: the machine's
// cloud (Identity, else Source), the shutdown grace, the margin, where
// the verdict goes.
type Env struct {
	Identity  metadata.Identity
	Source    metadata.Source
	TermGrace time.Duration
	Margin    time.Duration
	Metrics   interface {
		NoticePromise(need time.Duration, budgets map[string]time.Duration)
	}
	Log *zap.Logger
}

// NewState is the prediction of an agent with env, nothing known yet.
func NewState(env Env) State { return State{cfg: env} }

// Estimate is the newest estimate of a notice checkpoint's time.
func (ps *State) Estimate() schedule.Estimate { return ps.p }

// Status is the notice checkpoint's prediction in `spotagent
// status` and `spotagent report`.
type Status struct {
	Bytes         int64   `json:"bytes"`
	NeedSeconds   float64 `json:"need_seconds"`          // request → committed, predicted
	LowerBound    bool    `json:"lower_bound,omitempty"` // need is at least this (restore figures only)
	SaveSeconds   float64 `json:"save_seconds,omitempty"`
	UploadSeconds float64 `json:"upload_seconds,omitempty"`
	BytesPerSec   float64 `json:"bytes_per_sec,omitempty"`
	Pipelined     bool    `json:"pipelined"`
	Source        string  `json:"source"` // checkpoint, journal or restore
	MarginSeconds float64 `json:"margin_seconds"`
	// Notice is this machine's: a cloud's, or "signal" (the shutdown
	// grace) without one.
	Notice  string   `json:"notice"`
	Clouds  []Cloud  `json:"clouds"`
	Problem string   `json:"problem,omitempty"` // why it does not fit this machine's notice
	Advice  []string `json:"advice,omitempty"`
}

// Cloud is the verdict for one notice.
type Cloud struct {
	Cloud         string  `json:"cloud"`
	NoticeSeconds float64 `json:"notice_seconds"`
	BudgetSeconds float64 `json:"budget_seconds"` // notice − margin
	Fits          bool    `json:"fits"`
}

// Describe is p judged against every cloud's notice and own (this
// machine's), margin kept; nil when nothing is known.
func Describe(p schedule.Estimate, own schedule.CloudNotice, margin time.Duration) *Status {
	if !p.Known() {
		return nil
	}
	st := &Status{
		Bytes: p.Bytes, NeedSeconds: p.Need().Seconds(), LowerBound: p.Lower, SaveSeconds: p.Save.Seconds(),
		UploadSeconds: p.Upload.Seconds(), BytesPerSec: p.Rate, Pipelined: p.Pipelined, Source: p.Source,
		MarginSeconds: margin.Seconds(), Notice: own.Cloud,
	}
	notices := schedule.CloudNotices
	if _, ok := schedule.NoticeFor(own.Cloud); !ok {
		notices = append(append([]schedule.CloudNotice(nil), notices...), own)
	}
	for _, c := range notices {
		st.Clouds = append(st.Clouds, Cloud{Cloud: c.Cloud, NoticeSeconds: c.Lead.Seconds(),
			BudgetSeconds: schedule.Budget(c.Lead, margin).Seconds(), Fits: p.Fits(c.Lead, margin)})
	}
	if st.Problem = p.Problem(own, margin); st.Problem != "" {
		st.Advice = p.Advice(schedule.Budget(own.Lead, margin))
	}
	return st
}

// FromJournal is the prediction a journal allows: its newest
// checkpoint's figures, else (lower bound) its newest restore's size at
// the restore's rate.
func FromJournal(j *journal.Journal) schedule.Estimate {
	s := j.Stats
	if s.LastBytes > 0 && s.BytesPerSec > 0 {
		return schedule.Estimate{Bytes: s.LastBytes, Rate: s.BytesPerSec, Source: "journal", Pipelined: s.Pipelined,
			Upload: seconds(float64(s.LastBytes) / s.BytesPerSec), Save: seconds(s.SaveSeconds), Took: seconds(s.CheckpointSeconds),
			Lower: s.SaveSeconds == 0 && s.CheckpointSeconds == 0} // an older agent's journal: the save was not recorded
	}
	for i := len(j.Restores) - 1; i >= 0; i-- {
		r := j.Restores[i]
		if r.Bytes > 0 && r.Seconds > 0 {
			// Downloads are usually faster than uploads: what the restore
			// took is the least the upload of the same bytes takes.
			return schedule.Estimate{Bytes: r.Bytes, Rate: float64(r.Bytes) / r.Seconds, Upload: seconds(r.Seconds), Source: "restore", Lower: true}
		}
	}
	return schedule.Estimate{}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ownNotice is the notice this machine gets: its cloud's, or without one
// the shutdown grace (--term-grace) a SIGTERM gives.
func (ps *State) ownNotice() schedule.CloudNotice {
	cloud := ps.cfg.Identity.Cloud
	if (cloud == "" || cloud == metadata.CloudNone) && ps.cfg.Source != nil {
		cloud = ps.cfg.Source.Cloud()
	}
	if c, ok := schedule.NoticeFor(string(cloud)); ok {
		return c
	}
	return schedule.CloudNotice{Cloud: string(metadata.CloudSignal), Name: "a shutdown (--term-grace)", Lead: ps.cfg.TermGrace}
}

// Status is the status's view of the newest prediction.
func (ps *State) Status() *Status {
	return Describe(ps.p, ps.ownNotice(), ps.cfg.Margin)
}

// set makes p the newest prediction, exports it and logs a change
// of verdict for this machine's notice (at start, any verdict).
func (ps *State) set(p schedule.Estimate, start bool) {
	if !p.Known() {
		return
	}
	ps.p = p
	own := ps.ownNotice()
	budgets := map[string]time.Duration{}
	for _, c := range schedule.CloudNotices {
		budgets[c.Cloud] = schedule.Budget(c.Lead, ps.cfg.Margin)
	}
	ps.cfg.Metrics.NoticePromise(p.Need(), budgets)
	fields := []zap.Field{zap.String("notice", own.Cloud), zap.Duration("need", p.Need().Round(time.Millisecond)),
		zap.Duration("budget", schedule.Budget(own.Lead, ps.cfg.Margin)), zap.Int64("bytes", p.Bytes), zap.String("source", p.Source)}
	if problem := p.Problem(own, ps.cfg.Margin); problem != "" {
		if ps.misfit && !start {
			return // said once; said again only after it fitted in between
		}
		ps.misfit = true
		ps.cfg.Log.Warn("a notice checkpoint will not commit before the machine goes: "+problem,
			append(fields, zap.Strings("advice", p.Advice(schedule.Budget(own.Lead, ps.cfg.Margin))))...)
		return
	}
	if start || ps.misfit {
		ps.misfit = false
		ps.cfg.Log.Info("a notice checkpoint commits within the notice", fields...)
	}
}

// AtStart predicts from the journal an earlier session wrote and
// says whether a notice checkpoint fits.
func (ps *State) AtStart(j *journal.Writer) {
	if j == nil {
		return
	}
	ps.set(FromJournal(j.Snapshot()), true)
}

// Note records what the checkpoint requested at sent for reason (its
// files uploaded before done when pipelined), committed now as res (its
// commit having started at commitStart), measured.
func (ps *State) Note(reason string, sent time.Time, pipelined bool, res *commit.Result, commitStart, now time.Time, asks bool) {
	if reason == protocol.ReasonManual || !asks || res.Bytes <= 0 {
		// A trainer's own checkpoint has no measured save; zero-code mode
		// has no request (its save is the trainer's business).
		return
	}
	var rate float64
	if res.Upload > 0 {
		rate = float64(res.Bytes) / res.Upload.Seconds()
	}
	ps.set(schedule.Estimate{Bytes: res.Bytes, Save: commitStart.Sub(sent), Upload: res.Upload, Took: now.Sub(sent),
		Pipelined: pipelined, Source: "checkpoint", Rate: rate}, false)
}
