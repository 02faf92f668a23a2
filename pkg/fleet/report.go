package fleet

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"
)

// Options select the runs of a report and price them.
type Options struct {
	Now time.Time
	// Since keeps the runs active in the last Since (their end, or now for
	// a running one, is within it); 0 keeps every run.
	Since time.Duration
	// RunIDs keeps the runs whose id matches one of these path.Match
	// patterns; none keeps every run.
	RunIDs []string
	Prices Prices
}

// forecastDays is the horizon of the spend forecast.
const forecastDays = 30

// Figures are the numbers of one table row: a cell, a run or the fleet.
type Figures struct {
	Runs          int     `json:"runs"`
	MachineHours  float64 `json:"machine_hours"` // paid: sessions' time on machines
	WallHours     float64 `json:"wall_hours"`    // machine hours + time between machines
	Interruptions int     `json:"interruptions"`
	// Rate is interruptions per machine hour, RateLow..RateHigh its exact
	// 90 % Poisson interval (rateInterval); nil without machine time.
	Rate     *float64 `json:"rate_per_hour"`
	RateLow  *float64 `json:"rate_low"`
	RateHigh *float64 `json:"rate_high"`
	// NoticeCommits counts interruptions whose notice checkpoint committed.
	NoticeCommits int `json:"notice_commits"`
	// LeadMedian and LeadMin are the notice lead times (notice → deadline)
	// in seconds, over the interruptions that recorded both; nil if none.
	LeadMedian *float64 `json:"lead_median_s"`
	LeadMin    *float64 `json:"lead_min_s"`
	LostHours  float64  `json:"lost_hours"`
	LostSteps  int64    `json:"lost_steps"`
	// BetweenHours is the time not training because of an interruption
	// after it: the rest of the session on the machine, then no machine
	// until the next session. BetweenPerInterruption is its mean, seconds.
	BetweenHours           float64  `json:"between_hours"`
	BetweenPerInterruption *float64 `json:"between_per_interruption_s"`
	RestoreHours           float64  `json:"restore_hours"`
	// Restores counts the restores; RestoredBytes is their bytes by
	// source: local (the machine's own copy), peer (another node's),
	// store. Restores recorded before sources were have none.
	Restores      int              `json:"restores"`
	RestoredBytes map[string]int64 `json:"restored_bytes,omitempty"`
	Goodput       float64          `json:"goodput"` // productive / wall
	Steps         float64          `json:"steps"`   // training steps kept
	Money         *Money           `json:"money,omitempty"`
}

// Money is what the machine time cost at the report's prices.
type Money struct {
	Spend    float64 `json:"spend"`     // machine hours × spot price
	Wasted   float64 `json:"wasted"`    // (lost + restore + after an interruption) × spot price
	OnDemand float64 `json:"on_demand"` // (productive + blocked) × on-demand price
	Saving   float64 `json:"saving"`    // on demand − spend
	// CostPer1kSteps is spend per 1,000 steps kept; nil without steps.
	CostPer1kSteps *float64 `json:"cost_per_1k_steps"`
	// Forecast30d and ForecastSaving30d are spend and saving over the next
	// 30 days at the usage of the forecast window (Report.WindowDays).
	Forecast30d       float64 `json:"forecast_30d"`
	ForecastSaving30d float64 `json:"forecast_saving_30d"`
	// UnpricedHours is machine time without a price (not in Spend).
	UnpricedHours float64 `json:"unpriced_hours,omitempty"`
}

// CellRow is one cloud × instance type × zone.
type CellRow struct {
	Key
	Figures
}

// RunRow is one run.
type RunRow struct {
	ID    string    `json:"id"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Figures
}

// Interruption is one interruption for the plot, with its cell.
type Interruption struct {
	At        time.Time `json:"at"`
	Run       string    `json:"run"`
	Key       Key       `json:"key"`
	Committed bool      `json:"committed"`
}

// Report is the fleet view: by cell, by run and in total.
type Report struct {
	Generated time.Time `json:"generated"`
	Source    string    `json:"source"` // "summary" or "recount"
	// WindowDays is the usage window the 30-day forecast extrapolates:
	// --since (30 days without it), at most back to the first run's start.
	WindowDays    float64        `json:"window_days"`
	Cells         []CellRow      `json:"cells"`
	Runs          []RunRow       `json:"runs"`
	Total         Figures        `json:"total"`
	Interruptions []Interruption `json:"interruptions"`
	Damaged       []Damaged      `json:"damaged,omitempty"`
}

// acc accumulates the figures of one row.
type acc struct {
	c                       Cell
	runs                    map[string]bool
	leads                   []float64
	steps                   float64
	spend, wasted, onDemand float64
	fcSpend, fcSaving       float64
	unpriced                float64
	priced                  bool
}

func newAcc() *acc { return &acc{runs: map[string]bool{}} }

// Build makes the report of the runs of s that o selects. damaged (from
// Recount) is carried into the report.
func Build(s *Summary, o Options, source string, damaged []Damaged) (*Report, error) {
	for _, p := range o.RunIDs {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("--run-id %q: %w", p, err)
		}
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	var runs []*Run
	earliest := now
	for _, r := range s.Runs {
		if o.Since > 0 && r.End.Before(now.Add(-o.Since)) {
			continue
		}
		if !matchAny(o.RunIDs, r.ID) {
			continue
		}
		runs = append(runs, r)
		if r.Start.Before(earliest) {
			earliest = r.Start
		}
	}
	slices.SortFunc(runs, func(a, b *Run) int { return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.Dir, b.Dir)) })
	window := 30 * 24 * time.Hour
	if o.Since > 0 {
		window = o.Since
	}
	window = max(min(window, now.Sub(earliest)), time.Hour)
	rep := &Report{Generated: now.UTC(), Source: source, WindowDays: window.Hours() / 24, Damaged: damaged}
	cells := map[Key]*acc{}
	total := newAcc()
	for _, r := range runs {
		ra := newAcc()
		tot := r.Total()
		frac := overlap(r.Start, r.End, now.Add(-window), now)
		for i := range r.Cells {
			c := &r.Cells[i]
			ca := cells[c.Key]
			if ca == nil {
				ca = newAcc()
				cells[c.Key] = ca
			}
			var steps float64
			if tot.Productive > 0 {
				steps = float64(r.Steps) * c.Productive / tot.Productive
			}
			for _, a := range []*acc{ca, ra, total} {
				a.addCell(r.ID, c, steps, o.Prices.For(c.Key), frac, window)
			}
		}
		for _, e := range r.Events {
			if e.Cell < 0 || e.Cell >= len(r.Cells) {
				continue
			}
			k := r.Cells[e.Cell].Key
			rep.Interruptions = append(rep.Interruptions, Interruption{At: e.At, Run: r.ID, Key: k, Committed: e.Committed})
			if e.Lead != nil {
				for _, a := range []*acc{cells[k], ra, total} {
					a.leads = append(a.leads, *e.Lead)
				}
			}
		}
		rep.Runs = append(rep.Runs, RunRow{ID: r.ID, Start: r.Start, End: r.End, Figures: ra.figures()})
	}
	for k, a := range cells {
		rep.Cells = append(rep.Cells, CellRow{Key: k, Figures: a.figures()})
	}
	slices.SortFunc(rep.Cells, func(a, b CellRow) int { return compareKeys(a.Key, b.Key) })
	slices.SortFunc(rep.Interruptions, func(a, b Interruption) int { return a.At.Compare(b.At) })
	rep.Total = total.figures()
	return rep, nil
}

func matchAny(globs []string, id string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, id); ok {
			return true
		}
	}
	return false
}

// overlap is the fraction of [a, b] inside [from, to] (a point: 0 or 1).
func overlap(a, b, from, to time.Time) float64 {
	if !b.After(a) {
		if a.Before(from) || a.After(to) {
			return 0
		}
		return 1
	}
	lo, hi := maxTime(a, from), minTime(b, to)
	if !hi.After(lo) {
		return 0
	}
	return hi.Sub(lo).Seconds() / b.Sub(a).Seconds()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (a *acc) addCell(run string, c *Cell, steps float64, p Price, frac float64, window time.Duration) {
	a.c.add(c)
	a.runs[run] = true
	a.steps += steps
	if p.Spot <= 0 {
		a.unpriced += c.Machine / 3600
		return
	}
	a.priced = true
	spend := p.Spot * c.Machine / 3600
	od := p.OnDemand * (c.Productive + c.Blocked) / 3600
	a.spend += spend
	a.wasted += p.Spot * (c.Lost + c.Restore + c.After) / 3600
	a.onDemand += od
	scale := frac * forecastDays * 24 * time.Hour.Hours() / window.Hours()
	a.fcSpend += spend * scale
	if p.OnDemand > 0 {
		a.fcSaving += (od - spend) * scale
	}
}

func ptr(v float64) *float64 { return &v }

func (a *acc) figures() Figures {
	c := &a.c
	f := Figures{
		Runs: len(a.runs), MachineHours: c.Machine / 3600, WallHours: c.Wall() / 3600,
		Interruptions: c.Interruptions, NoticeCommits: c.NoticeCommits,
		LostHours: c.Lost / 3600, LostSteps: c.LostSteps, RestoreHours: c.Restore / 3600,
		BetweenHours: (c.After + c.Gap) / 3600, Steps: a.steps,
		Restores: c.Restores, RestoredBytes: maps.Clone(c.RestoredFrom),
	}
	if h := c.Machine / 3600; h > 0 {
		lo, hi := rateInterval(c.Interruptions, h, Confidence)
		f.Rate, f.RateLow, f.RateHigh = ptr(float64(c.Interruptions)/h), ptr(lo), ptr(hi)
	}
	if c.Interruptions > 0 {
		f.BetweenPerInterruption = ptr((c.After + c.Gap) / float64(c.Interruptions))
	}
	if len(a.leads) > 0 {
		l := slices.Clone(a.leads)
		slices.Sort(l)
		m := l[len(l)/2]
		if len(l)%2 == 0 {
			m = (l[len(l)/2-1] + l[len(l)/2]) / 2
		}
		f.LeadMedian, f.LeadMin = ptr(m), ptr(l[0])
	}
	if w := c.Wall(); w > 0 {
		f.Goodput = c.Productive / w
	}
	if a.priced {
		m := &Money{Spend: a.spend, Wasted: a.wasted, OnDemand: a.onDemand, Forecast30d: a.fcSpend,
			ForecastSaving30d: a.fcSaving, UnpricedHours: a.unpriced}
		if a.onDemand > 0 {
			m.Saving = a.onDemand - a.spend
		}
		if a.steps > 0 {
			m.CostPer1kSteps = ptr(1000 * a.spend / a.steps)
		}
		f.Money = m
	}
	return f
}
