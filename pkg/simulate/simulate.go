package simulate

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Kinds of Event.
const (
	Announced   = "announced"   // an interruption with a notice Lead before At
	Unannounced = "unannounced" // an interruption without notice
	Rebalance   = "rebalance"   // a live hazard signal, no interruption
)

// Event is one line of an interruption trace.
type Event struct {
	At   time.Duration // since the start of the run (wall clock)
	Kind string
	Lead time.Duration // announced: how long before At the notice came
}

// Params are the costs a simulated run pays.
type Params struct {
	Delta    time.Duration // blocking cost of one checkpoint
	Restart  time.Duration // from the machine's loss to the restored trainer running again
	Upload   time.Duration // upload time of one checkpoint, in the background
	Bytes    int64         // checkpoint size, only to feed ObserveUpload (default 1 GiB)
	Duration time.Duration // wall-clock length of the run
	// Scheduler settings for every policy (Fixed is set per policy).
	Min, Max  time.Duration
	PriorRate float64 // --interruption-rate of the adaptive policy
	// History is what the run journal holds before the simulated run
	// starts (zero: a new run); the adaptive policy's first Scheduler is
	// seeded with it, and later lives with it plus what they saw.
	History schedule.History
}

// Policy is a checkpoint policy: adaptive (Fixed == 0) or a fixed interval.
type Policy struct {
	Name  string
	Fixed time.Duration
}

// Result is where a simulated run's wall-clock time went.
type Result struct {
	Useful        time.Duration // progress kept at the end
	Overhead      time.Duration // blocked in checkpoints (periodic and notice-driven)
	Lost          time.Duration // computed, then lost to an interruption
	Restart       time.Duration // not training because of an interruption (stopped after a notice checkpoint, restarting)
	Checkpoints   int
	Interruptions int
}

// Waste returns overhead, lost work and restart time as a % of useful work.
func (r Result) Waste() float64 {
	if r.Useful <= 0 {
		return math.Inf(1)
	}
	return 100 * float64(r.Overhead+r.Lost+r.Restart) / float64(r.Useful)
}

// Add accumulates o into r.
func (r *Result) Add(o Result) {
	r.Useful += o.Useful
	r.Overhead += o.Overhead
	r.Lost += o.Lost
	r.Restart += o.Restart
	r.Checkpoints += o.Checkpoints
	r.Interruptions += o.Interruptions
}

// ParsePolicies parses "adaptive,fixed:5m,fixed:15m".
func ParsePolicies(s string) ([]Policy, error) {
	var ps []Policy
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case f == "adaptive":
			ps = append(ps, Policy{Name: f})
		case strings.HasPrefix(f, "fixed:"):
			d, err := time.ParseDuration(strings.TrimPrefix(f, "fixed:"))
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("policy %q: want fixed:<positive duration>", f)
			}
			ps = append(ps, Policy{Name: f, Fixed: d})
		default:
			return nil, fmt.Errorf("policy %q: want adaptive or fixed:<duration>", f)
		}
	}
	if len(ps) == 0 {
		return nil, errors.New("no policies")
	}
	return ps, nil
}

// SynthConfig describes a synthetic trace: Poisson interruptions at Rate per
// hour, of which a fraction NoticeSuccess are announced with Lead (long
// enough for the notice checkpoint to commit), the rest unannounced.
type SynthConfig struct {
	Rate          float64
	Duration      time.Duration
	NoticeSuccess float64
	Lead          time.Duration
	Seed          uint64
}

// SyntheticTrace returns a reproducible trace for c.
func SyntheticTrace(c SynthConfig) []Event {
	if c.Rate <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x5907a6e47))
	var evs []Event
	t := time.Duration(0)
	for {
		t += time.Duration(rng.ExpFloat64() / c.Rate * float64(time.Hour))
		if t >= c.Duration {
			return evs
		}
		e := Event{At: t, Kind: Unannounced}
		if rng.Float64() < c.NoticeSuccess {
			e.Kind, e.Lead = Announced, c.Lead
		}
		evs = append(evs, e)
	}
}

// ReadTrace reads a CSV trace: time,kind,lead_seconds with an optional
// header line and # comments. time is seconds since the start of the run,
// or RFC 3339 (the earliest row's time is then the start; one style per
// file). kind is announced, unannounced or rebalance; lead_seconds is the
// notice lead of an announced interruption. Rows may come in any order.
func ReadTrace(r io.Reader) ([]Event, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	type row struct {
		secs    float64
		abs     time.Time
		isAbs   bool
		kind    string
		leadSec float64
	}
	var rows []row
	for i, rec := range recs {
		if len(rec) < 2 {
			return nil, fmt.Errorf("trace line %d: want time,kind[,lead_seconds]", i+1)
		}
		if i == 0 && strings.EqualFold(strings.TrimSpace(rec[0]), "time") {
			continue
		}
		var rw row
		ts := strings.TrimSpace(rec[0])
		if v, err := strconv.ParseFloat(ts, 64); err == nil {
			rw.secs = v
		} else if t, err := time.Parse(time.RFC3339, ts); err == nil {
			rw.abs, rw.isAbs = t, true
		} else {
			return nil, fmt.Errorf("trace line %d: time %q: want seconds or RFC 3339", i+1, ts)
		}
		rw.kind = strings.ToLower(strings.TrimSpace(rec[1]))
		if rw.kind != Announced && rw.kind != Unannounced && rw.kind != Rebalance {
			return nil, fmt.Errorf("trace line %d: kind %q: want announced, unannounced or rebalance", i+1, rec[1])
		}
		if len(rec) > 2 && strings.TrimSpace(rec[2]) != "" {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[2]), 64)
			if err != nil || v < 0 {
				return nil, fmt.Errorf("trace line %d: lead_seconds %q: want seconds >= 0", i+1, rec[2])
			}
			rw.leadSec = v
		}
		if len(rows) > 0 && rows[0].isAbs != rw.isAbs {
			return nil, fmt.Errorf("trace line %d: mixes seconds and RFC 3339 times", i+1)
		}
		rows = append(rows, rw)
	}
	var start time.Time
	for i, rw := range rows {
		if rw.isAbs && (i == 0 || rw.abs.Before(start)) {
			start = rw.abs
		}
	}
	evs := make([]Event, 0, len(rows))
	for _, rw := range rows {
		at := secondsDur(rw.secs)
		if rw.isAbs {
			at = rw.abs.Sub(start)
		}
		if at < 0 {
			return nil, fmt.Errorf("trace: negative time %v", at)
		}
		evs = append(evs, Event{At: at, Kind: rw.kind, Lead: secondsDur(rw.leadSec)})
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return evs, nil
}

// simEvent is a Event with when the simulation acts on it: the notice
// time for an announced interruption whose notice checkpoint can commit
// (Lead ≥ δ + upload), otherwise At. An announced interruption whose notice
// is too short is an unannounced one.
type simEvent struct {
	Event
	act       time.Duration
	committed bool
}

var simEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Simulate replays trace against one policy. It drives the same Scheduler
// the agent runs, in simulated time: each machine life gets a new Scheduler
// seeded with ObserveHistory from what the run journal would hold (run time,
// interruptions, committed notices, cost, throughput) and fed ObserveCost and
// ObserveUpload as checkpoints complete, and rebalance events as Hazard. It
// sees only the past. Model: a periodic checkpoint blocks training for Delta,
// then uploads for Upload in the background and counts once uploaded; the
// next is not requested while an upload runs. An announced interruption
// whose notice fits δ + upload takes a notice checkpoint (Delta of overhead,
// nothing lost), the trainer then stops until the machine goes; any other
// interruption loses the work since the last uploaded checkpoint. Each
// interruption costs Restart before training resumes; an interruption
// during a restart starts it again.
func Simulate(trace []Event, pol Policy, p Params) Result {
	if p.Bytes <= 0 {
		p.Bytes = 1 << 30
	}
	cfg := schedule.SchedulerConfig{Fixed: pol.Fixed, Min: p.Min, Max: p.Max, InterruptionRate: p.PriorRate}
	sr := &simRun{p: p, evs: actingOrder(trace, p), end: p.Duration, hist: p.History}
	for sr.now < sr.end {
		sr.restart()
		if sr.now >= sr.end {
			break
		}
		sr.life(schedule.NewScheduler(cfg))
	}
	sr.r.Useful = sr.progress
	return sr.r
}

// actingOrder is trace in the order its events act: an announced
// interruption whose notice fits δ + upload acts (its notice checkpoint
// commits) at its notice, every other event at its time.
func actingOrder(trace []Event, p Params) []simEvent {
	evs := make([]simEvent, 0, len(trace))
	for _, e := range trace {
		se := simEvent{Event: e, act: e.At}
		if e.Kind == Announced && e.Lead >= p.Delta+p.Upload {
			se.committed, se.act = true, max(e.At-e.Lead, 0)
		}
		evs = append(evs, se)
	}
	slices.SortStableFunc(evs, func(a, b simEvent) int { return cmp.Compare(a.act, b.act) })
	return evs
}

// simRun is one simulated run of Simulate: its clock, its progress, what
// the journal would hold, and the events still to come.
type simRun struct {
	p         Params
	evs       []simEvent
	ei        int // the next event
	end, now  time.Duration
	progress  time.Duration // useful compute so far
	committed time.Duration // progress in the newest uploaded checkpoint
	hist      schedule.History
	r         Result
}

// simLife is one machine life's checkpoint state.
type simLife struct {
	s                   *schedule.Scheduler
	start, last         time.Duration // the life's start; the last checkpoint's end
	blocking, uploading bool
	blockEnd, upEnd     time.Duration
	snap, upSnap        time.Duration // progress in the checkpoint saving, uploading
}

// What comes next in a machine life.
const (
	doEnd = iota
	doBlock
	doUpload
	doDue
	doEvent
)

func simAt(d time.Duration) time.Time { return simEpoch.Add(d) }

// down: not training from now to until.
func (sr *simRun) down(until time.Duration) {
	sr.r.Restart += min(until, sr.end) - min(sr.now, sr.end)
	sr.now = until
}

// restart counts the interruptions of the replacement machine while it
// restarts.
func (sr *simRun) restart() {
	for sr.ei < len(sr.evs) && sr.evs[sr.ei].At < sr.now {
		if sr.evs[sr.ei].Kind != Rebalance {
			sr.r.Interruptions++
			sr.down(sr.evs[sr.ei].At + sr.p.Restart)
		}
		sr.ei++
	}
}

// life runs one machine life with a fresh Scheduler s, until the run's end
// or an interruption.
func (sr *simRun) life(s *schedule.Scheduler) {
	s.ObserveHistory(sr.hist)
	l := &simLife{s: s, start: sr.now, last: sr.now}
	for sr.now < sr.end {
		next, what := sr.next(l)
		if l.blocking {
			sr.r.Overhead += next - sr.now
		} else {
			sr.progress += next - sr.now
		}
		sr.now = next
		if sr.step(l, what) {
			return
		}
	}
}

// next is when the life's next thing happens, and what.
func (sr *simRun) next(l *simLife) (time.Duration, int) {
	next, what := sr.end, doEnd
	if sr.ei < len(sr.evs) && max(sr.evs[sr.ei].act, sr.now) < next {
		next, what = max(sr.evs[sr.ei].act, sr.now), doEvent
	}
	switch {
	case l.blocking:
		if l.blockEnd <= next {
			next, what = l.blockEnd, doBlock
		}
	default:
		if l.uploading && l.upEnd <= next {
			next, what = l.upEnd, doUpload
		} else if due := l.s.Next(simAt(l.last), l.uploading, simAt(sr.now)).Sub(simEpoch); due <= next {
			next, what = max(due, sr.now), doDue
		}
	}
	return next, what
}

// step does what, now; true when it ends the life.
func (sr *simRun) step(l *simLife, what int) bool {
	p := sr.p
	switch what {
	case doEnd:
		return true
	case doBlock:
		l.blocking, l.last = false, sr.now
		l.s.ObserveCost(p.Delta)
		sr.hist.Cost = l.s.Cost()
		sr.r.Checkpoints++
		l.uploading, l.upEnd, l.upSnap = true, sr.now+p.Upload, l.snap
	case doUpload:
		l.uploading = false
		sr.committed = l.upSnap
		l.s.ObserveUpload(p.Upload, p.Bytes)
		sr.hist.Throughput = l.s.Throughput()
	case doDue:
		if !l.uploading { // else re-ask
			l.blocking, l.blockEnd, l.snap = true, sr.now+p.Delta, sr.progress
		}
	case doEvent:
		return sr.event(l)
	}
	return false
}

// event handles the next event: a rebalance recommendation is a hazard;
// an interruption ends the life, its notice checkpoint committed or the
// work since the last uploaded checkpoint lost.
func (sr *simRun) event(l *simLife) bool {
	p, e := sr.p, sr.evs[sr.ei]
	sr.ei++
	if e.Kind == Rebalance {
		l.s.Hazard(simAt(sr.now), "rebalance", time.Time{})
		return false
	}
	sr.r.Interruptions++
	sr.hist.Interruptions++
	sr.hist.RunTime += e.At - l.start
	if e.committed {
		sr.hist.NoticeCommitted++
		sr.r.Overhead += min(p.Delta, sr.end-sr.now)
		sr.now += p.Delta
		sr.committed = sr.progress
	} else {
		sr.r.Lost += sr.progress - sr.committed
		sr.progress = sr.committed
	}
	sr.down(max(e.At+p.Restart, sr.now))
	return true
}

// GridConfig is the table of docs/frequency.md: every combination of Rates,
// Notices and Deltas, each averaged over Runs synthetic runs of Duration.
type GridConfig struct {
	Rates    []float64       // interruptions per hour
	Notices  []float64       // fraction of interruptions whose notice checkpoint commits
	Deltas   []time.Duration // blocking cost
	Fixed    []time.Duration // fixed-interval columns
	Restart  time.Duration
	Upload   time.Duration
	Duration time.Duration
	Runs     int
	Seed     uint64
	Min, Max time.Duration
	// PriorRate is the adaptive policy's --interruption-rate: the default,
	// not the cell's true rate, which it has to learn.
	PriorRate float64
	Workers   int
	// Progress, when set, is called after each cell with the number done
	// and the total, from one goroutine at a time.
	Progress func(done, total int)
}

// DefaultGrid returns the grid of issue 6.
func DefaultGrid() GridConfig {
	return GridConfig{
		Rates:     []float64{0.008, 0.023, 0.041},
		Notices:   []float64{0, 0.9, 1},
		Deltas:    []time.Duration{5 * time.Second, 30 * time.Second, 120 * time.Second},
		Fixed:     []time.Duration{5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, 60 * time.Minute},
		Restart:   5 * time.Minute,
		Upload:    time.Minute,
		Duration:  30 * 24 * time.Hour,
		Runs:      200,
		Seed:      1,
		Min:       schedule.DefaultMinInterval,
		Max:       schedule.DefaultMaxInterval,
		PriorRate: schedule.DefaultInterruptionRate,
		Workers:   2,
	}
}

// GridCell is one row of the grid.
type GridCell struct {
	Rate, Notice float64
	Delta        time.Duration
	Adaptive     Result
	Fixed        []Result // as GridConfig.Fixed
	Best         Result   // best fixed interval in hindsight
	BestInterval time.Duration
	Searched     int // fixed intervals tried for Best
}

// Ratio is adaptive waste over the best fixed interval's.
func (c GridCell) Ratio() float64 { return c.Adaptive.Waste() / c.Best.Waste() }

// Lead is the notice lead of a synthetic announced interruption: AWS's
// two minutes, or longer when δ + upload would not fit, because the
// synthetic notice-success fraction says the notice checkpoint commits.
func Lead(delta, upload time.Duration) time.Duration {
	return max(2*time.Minute, delta+upload)
}

// RunGrid simulates every cell of c. Cells run in parallel on c.Workers
// goroutines; the result does not depend on the number of workers.
func RunGrid(c GridConfig) []GridCell {
	var cells []GridCell
	for _, rate := range c.Rates {
		for _, ns := range c.Notices {
			for _, d := range c.Deltas {
				cells = append(cells, GridCell{Rate: rate, Notice: ns, Delta: d})
			}
		}
	}
	work := make(chan int)
	done := make(chan struct{})
	var mu sync.Mutex
	finished := 0
	for range max(c.Workers, 1) {
		go func() {
			for i := range work {
				runCell(c, &cells[i])
				if c.Progress != nil {
					mu.Lock()
					finished++
					c.Progress(finished, len(cells))
					mu.Unlock()
				}
			}
			done <- struct{}{}
		}()
	}
	for i := range cells {
		work <- i
	}
	close(work)
	for range max(c.Workers, 1) {
		<-done
	}
	return cells
}

func runCell(c GridConfig, cell *GridCell) {
	p := Params{Delta: cell.Delta, Restart: c.Restart, Upload: c.Upload, Duration: c.Duration,
		Min: c.Min, Max: c.Max, PriorRate: c.PriorRate}
	traces := make([][]Event, c.Runs)
	for i := range traces {
		traces[i] = SyntheticTrace(SynthConfig{Rate: cell.Rate, Duration: c.Duration, NoticeSuccess: cell.Notice,
			Lead: Lead(cell.Delta, c.Upload), Seed: c.Seed + uint64(i)})
	}
	run := func(pol Policy) Result {
		var sum Result
		for _, tr := range traces {
			sum.Add(Simulate(tr, pol, p))
		}
		return sum
	}
	cell.Adaptive = run(Policy{Name: "adaptive"})
	fixed := map[time.Duration]Result{}
	try := func(d time.Duration) Result {
		d = d.Round(time.Second)
		if r, ok := fixed[d]; ok {
			return r
		}
		r := run(Policy{Fixed: d})
		fixed[d] = r
		return r
	}
	for _, d := range c.Fixed {
		cell.Fixed = append(cell.Fixed, try(d))
	}
	// Hindsight: a fine geometric grid (steps of 8 %) within a factor 4 of
	// the interval Daly's formula gives for the true rate and notice
	// success, widened while the best lies on an edge, within [Min, Max].
	ideal := c.Max
	if u := cell.Rate * (1 - cell.Notice); u > 0 {
		ideal = min(max(schedule.DalyInterval(cell.Delta, time.Duration(float64(time.Hour)/u)), c.Min, c.Upload), c.Max)
	}
	lo, hi := max(ideal/4, c.Min), min(ideal*4, c.Max)
	for {
		for d := lo; d <= hi; d = time.Duration(float64(d) * 1.08) {
			try(d)
		}
		try(hi)
		best := bestOf(fixed)
		if best <= time.Duration(float64(lo)*1.08) && lo > c.Min {
			lo, hi = max(lo/4, c.Min), lo
		} else if best >= time.Duration(float64(hi)/1.08) && hi < c.Max {
			lo, hi = hi, min(hi*4, c.Max)
		} else {
			break
		}
	}
	cell.BestInterval = bestOf(fixed)
	cell.Best = fixed[cell.BestInterval]
	cell.Searched = len(fixed)
}

func bestOf(m map[time.Duration]Result) time.Duration {
	var best time.Duration
	for d, r := range m {
		if best == 0 || r.Waste() < m[best].Waste() || (r.Waste() == m[best].Waste() && d < best) {
			best = d
		}
	}
	return best
}

// GridSummary says whether issue 6's targets hold for cells.
type GridSummary struct {
	WorstRatio    float64
	CellsOver     int       // cells where adaptive > 1.1 × best fixed
	AdaptiveSum   float64   // waste % summed over the cells
	FixedSum      []float64 // per fixed column
	BeatsAllFixed bool      // AdaptiveSum < every FixedSum
	BestSum       float64   // best fixed in hindsight, per cell, summed
}

// summarize computes the targets of issue 6 over cells.
func summarize(cells []GridCell) GridSummary {
	var s GridSummary
	if len(cells) == 0 {
		return s
	}
	s.FixedSum = make([]float64, len(cells[0].Fixed))
	for _, c := range cells {
		s.WorstRatio = max(s.WorstRatio, c.Ratio())
		if c.Ratio() > 1.1 {
			s.CellsOver++
		}
		s.AdaptiveSum += c.Adaptive.Waste()
		s.BestSum += c.Best.Waste()
		for i, f := range c.Fixed {
			s.FixedSum[i] += f.Waste()
		}
	}
	s.BeatsAllFixed = true
	for _, f := range s.FixedSum {
		if s.AdaptiveSum >= f {
			s.BeatsAllFixed = false
		}
	}
	return s
}

// WriteGrid prints cells as a Markdown table, then the summary.
func WriteGrid(w io.Writer, c GridConfig, cells []GridCell) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| hazard | notice | δ | adaptive |")
	for _, d := range c.Fixed {
		fmt.Fprintf(&b, " %s |", fmtDur(d))
	}
	fmt.Fprintf(&b, " best fixed | adaptive / best |\n|---|---|---|---|")
	for range c.Fixed {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	for _, cell := range cells {
		fmt.Fprintf(&b, "| %.1f %%/h | %.0f %% | %s | %.3f |", 100*cell.Rate, 100*cell.Notice, fmtDur(cell.Delta), cell.Adaptive.Waste())
		for _, f := range cell.Fixed {
			fmt.Fprintf(&b, " %.3f |", f.Waste())
		}
		mark := ""
		if cell.Ratio() > 1.1 {
			mark = " ✗"
		}
		fmt.Fprintf(&b, " %.3f @ %s | %.3f%s |\n", cell.Best.Waste(), fmtDur(cell.BestInterval), cell.Ratio(), mark)
	}
	s := summarize(cells)
	fmt.Fprintf(&b, "| **sum** | | | **%.3f** |", s.AdaptiveSum)
	for _, f := range s.FixedSum {
		fmt.Fprintf(&b, " %.3f |", f)
	}
	fmt.Fprintf(&b, " %.3f | |\n\n", s.BestSum)
	fmt.Fprintf(&b, "waste = (checkpoint overhead + lost work + restart time) / useful work, %%; %d runs of %s per cell, seeds %d..%d; restart %s, upload %s, prior rate %.3g/h, clamps [%s, %s]\n",
		c.Runs, fmtDur(c.Duration), c.Seed, c.Seed+uint64(c.Runs)-1, fmtDur(c.Restart), fmtDur(c.Upload), c.PriorRate, fmtDur(c.Min), fmtDur(c.Max))
	fmt.Fprintf(&b, "target 1 (every cell adaptive ≤ 1.1 × best fixed): %s (worst ratio %.3f, %d cells over)\n", verdict(s.CellsOver == 0), s.WorstRatio, s.CellsOver)
	fmt.Fprintf(&b, "target 2 (summed, adaptive beats every fixed column): %s\n", verdict(s.BeatsAllFixed))
	_, err := io.WriteString(w, b.String())
	return err
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// fmtDur prints 5s, 2m, 1h30m, 30d without trailing zero units.
func fmtDur(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// TraceFromJournal turns a run journal (journal.json) into a trace: each
// interruption at its detection, relative to the first session's start,
// announced with its notice lead (deadline − detection) when it had a
// deadline, else unannounced. It also returns the run's wall time (first
// start to last end, or to the last interruption).
func TraceFromJournal(j *checkpoint.Journal) ([]Event, time.Duration, error) {
	if j == nil || len(j.Sessions) == 0 {
		return nil, 0, errors.New("journal has no sessions")
	}
	start, end := j.Sessions[0].Start, j.Sessions[0].Start
	for _, s := range j.Sessions {
		if s.Start.Before(start) {
			start = s.Start
		}
		if s.End != nil && s.End.After(end) {
			end = *s.End
		}
	}
	var evs []Event
	for _, in := range j.Interruptions {
		e := Event{At: max(in.Detected.Sub(start), 0), Kind: Unannounced}
		if in.Deadline != nil && in.Deadline.After(in.Detected) {
			e.Kind, e.Lead = Announced, in.Deadline.Sub(in.Detected)
			e.At = in.Deadline.Sub(start)
		}
		evs = append(evs, e)
		if t := start.Add(e.At); t.After(end) {
			end = t
		}
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return evs, end.Sub(start), nil
}
