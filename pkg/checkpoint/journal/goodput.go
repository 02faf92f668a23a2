package journal

import (
	"fmt"
	"slices"
	"time"
)

// Goodput buckets: every second of a run's wall time (first session's start
// to the last session's end) falls in exactly one.
const (
	BucketProductive = "productive" // training whose progress was kept
	BucketBlocked    = "blocked"    // trainer blocked in checkpoints (request → done)
	BucketLost       = "lost"       // trained, then thrown away by an interruption
	BucketRestore    = "restore"    // restoring the newest checkpoint at start
	BucketBetween    = "between"    // from an interruption to the next session's start
	// BucketUnprotected is time the trainer ran with nobody able to
	// checkpoint it (it never connected, or left): not goodput, whether
	// or not it was lost in the end.
	BucketUnprotected = "unprotected"
)

// Buckets lists the buckets in report order.
var Buckets = []string{BucketProductive, BucketBlocked, BucketLost, BucketRestore, BucketBetween, BucketUnprotected}

// GoodputSession is the accounting of one session.
type GoodputSession struct {
	Index       int                `json:"index"`
	Start       time.Time          `json:"start"`
	End         time.Time          `json:"end"`
	Instance    string             `json:"instance,omitempty"`
	Interrupted bool               `json:"interrupted"`
	NoticeOK    bool               `json:"notice_committed"`
	Wall        float64            `json:"wall_seconds"`
	Seconds     map[string]float64 `json:"seconds"` // by bucket
}

// Ratio is productive over wall time.
func (s GoodputSession) Ratio() float64 { return ratio(s.Seconds[BucketProductive], s.Wall) }

// Goodput is where a run's wall time went.
type Goodput struct {
	RunID         string             `json:"run_id"`
	Start         time.Time          `json:"start"`
	End           time.Time          `json:"end"`
	Wall          float64            `json:"wall_seconds"`
	Seconds       map[string]float64 `json:"seconds"` // by bucket, over the run
	Ratio         float64            `json:"goodput_ratio"`
	Interruptions int                `json:"interruptions"`
	NoticeCommits int                `json:"notice_commits"`
	Restores      int                `json:"restores"` // restores at a session's start
	Sessions      []GoodputSession   `json:"sessions"`
	// Missing names what the journal lacks; the accounting makes do
	// without it (each entry says how).
	Missing []string `json:"missing,omitempty"`
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// Account splits the run's wall time into the goodput buckets. now ends a
// session that has none (still running, or its agent died): it is counted
// to its last recorded event, or to now for the newest session.
// An error means there is nothing to account (no sessions).
func Account(j *Journal, now time.Time) (*Goodput, error) {
	if j == nil || len(j.Sessions) == 0 {
		return nil, fmt.Errorf("journal has no sessions")
	}
	g := &Goodput{RunID: j.RunID, Seconds: map[string]float64{}}
	sess := slices.Clone(j.Sessions)
	slices.SortStableFunc(sess, func(a, b Session) int { return a.Start.Compare(b.Start) })
	ends := make([]time.Time, len(sess))
	for i, s := range sess {
		switch {
		case s.End != nil:
			ends[i] = *s.End
		default:
			last := lastEvent(j, s.Start, nextStart(sess, i))
			if i == len(sess)-1 {
				last = now
				g.Missing = append(g.Missing, fmt.Sprintf("session %d has no end (still running, or its agent died): counted to now", i+1))
			} else {
				g.Missing = append(g.Missing, fmt.Sprintf("session %d has no end (its agent died): counted to its last event, the rest as between machines", i+1))
			}
			ends[i] = last
		}
		if ends[i].Before(s.Start) {
			ends[i] = s.Start
		}
	}
	seen := map[int]bool{}
	for i, s := range sess {
		end := ends[i]
		gs := GoodputSession{Index: i + 1, Start: s.Start, End: end, Instance: s.Instance.InstanceID,
			Wall: end.Sub(s.Start).Seconds(), Seconds: map[string]float64{}}
		// The gap before this session: between machines.
		if i > 0 && s.Start.After(ends[i-1]) {
			gs.Seconds[BucketBetween] += s.Start.Sub(ends[i-1]).Seconds()
			gs.Wall += s.Start.Sub(ends[i-1]).Seconds()
		}
		var restore float64
		for _, r := range j.Restores {
			if !r.At.Before(s.Start) && !r.At.After(end) {
				restore += r.Seconds
				g.Restores++
			}
		}
		cut := end
		var lost float64
		for k, in := range j.Interruptions {
			if seen[k] || in.Detected.Before(s.Start) || in.Detected.After(end) {
				continue
			}
			seen[k] = true
			g.Interruptions++
			gs.Interrupted = true
			if in.CommitOK {
				g.NoticeCommits++
				gs.NoticeOK = true
			}
			lost += in.LostSeconds
			// After the interruption the trainer stops: the rest of the
			// session is time between machines.
			at := in.Detected
			if in.CommitOK && in.Committed != nil {
				at = *in.Committed
			}
			if at.Before(cut) {
				cut = at
			}
		}
		active := cut.Sub(s.Start).Seconds()
		blocked := 0.0
		if s.BlockedSeconds != nil {
			blocked = *s.BlockedSeconds
		} else {
			g.Missing = append(g.Missing, fmt.Sprintf("session %d has no blocked_seconds (journal of an older agent): blocked time counted as productive", i+1))
		}
		gs.split(active, restore, blocked, lost, s.UnprotectedSeconds)
		if failedUnkept(j, s, gs.Interrupted) {
			gs.Seconds[BucketLost] += gs.Seconds[BucketProductive]
			gs.Seconds[BucketProductive] = 0
		}
		gs.Seconds[BucketBetween] += end.Sub(cut).Seconds()
		for _, b := range Buckets {
			g.Seconds[b] += gs.Seconds[b]
		}
		g.Wall += gs.Wall
		g.Sessions = append(g.Sessions, gs)
	}
	for k, in := range j.Interruptions {
		if !seen[k] {
			g.Missing = append(g.Missing, fmt.Sprintf("interruption at %s falls in no session: not counted", in.Detected.Format(time.RFC3339)))
		}
	}
	g.Start, g.End = sess[0].Start, ends[len(ends)-1]
	g.Ratio = ratio(g.Seconds[BucketProductive], g.Wall)
	return g, nil
}

// failedUnkept: the session's trainer failed on its own (an exit code
// other than 0, 75 "interrupted, run me again" and 76 "fenced", no
// interruption in the session) and the run never committed a checkpoint,
// so nothing it trained was kept: its time is lost, not productive (a
// trainer that crashed at once once read "3s trained", goodput 100 %).
func failedUnkept(j *Journal, s Session, interrupted bool) bool {
	if s.ExitCode == nil || interrupted || j.Stats.Checkpoints > 0 {
		return false
	}
	switch *s.ExitCode {
	case 0, 75, 76: // protocol.ExitInterrupted and ExitFenced (pkg/protocol sits above the journal)
		return false
	}
	for _, in := range j.Interruptions {
		if in.CommitOK {
			return false
		}
	}
	return true
}

// nextStart is when the session after i starts (zero for the last).
func nextStart(sess []Session, i int) time.Time {
	if i+1 < len(sess) {
		return sess[i+1].Start
	}
	return time.Time{}
}

// lastEvent is the newest journal timestamp in [from, before) (before zero:
// unbounded), or from.
func lastEvent(j *Journal, from, before time.Time) time.Time {
	last := from
	see := func(t *time.Time) {
		if t != nil && t.After(last) && (before.IsZero() || t.Before(before)) {
			last = *t
		}
	}
	for _, in := range j.Interruptions {
		see(&in.Detected)
		see(in.Done)
		see(in.Committed)
	}
	for _, r := range j.Restores {
		end := r.At.Add(time.Duration(r.Seconds * float64(time.Second)))
		see(&end)
	}
	return last
}

// Money is what a run cost at an hourly price.
type Money struct {
	PricePerHour         float64 `json:"price_per_hour"`
	OnDemandPricePerHour float64 `json:"on_demand_price_per_hour,omitempty"`
	Spend                float64 `json:"spend"`               // machine time × price
	Wasted               float64 `json:"wasted"`              // machine time lost to interruptions × price
	OnDemand             float64 `json:"on_demand,omitempty"` // the same work on demand
	Saving               float64 `json:"saving_vs_on_demand,omitempty"`
}

// Cost prices g. Machines are paid while a session runs, not between
// sessions; interruptions waste lost work, restores and the time on a
// machine after an interruption. On demand, the run would have needed only
// its productive and blocked time.
func (g *Goodput) Cost(price, onDemand float64) Money {
	m := Money{PricePerHour: price, OnDemandPricePerHour: onDemand}
	var machine, wasted float64
	for _, s := range g.Sessions {
		gap := 0.0
		if s.Index > 1 {
			prev := g.Sessions[s.Index-2]
			gap = max(s.Start.Sub(prev.End).Seconds(), 0)
		}
		machine += s.Wall - gap
		wasted += s.Seconds[BucketLost] + s.Seconds[BucketRestore] + s.Seconds[BucketBetween] - gap
	}
	m.Spend = price * machine / 3600
	m.Wasted = price * wasted / 3600
	if onDemand > 0 {
		m.OnDemand = onDemand * (g.Seconds[BucketProductive] + g.Seconds[BucketBlocked]) / 3600
		m.Saving = m.OnDemand - m.Spend
	}
	return m
}

// split shares a session's active seconds among its buckets, each capped
// by what the ones before it left: restore, blocked, lost, unprotected
// (nil: a journal of an older agent, none), and the rest productive.
func (gs *GoodputSession) split(active, restore, blocked, lost float64, unprotected *float64) {
	restore = min(restore, active)
	blocked = min(blocked, active-restore)
	lost = min(lost, active-restore-blocked)
	unprot := 0.0
	if unprotected != nil {
		unprot = min(*unprotected, active-restore-blocked-lost)
	}
	gs.Seconds[BucketRestore] += restore
	gs.Seconds[BucketBlocked] += blocked
	gs.Seconds[BucketLost] += lost
	gs.Seconds[BucketUnprotected] += unprot
	gs.Seconds[BucketProductive] += active - restore - blocked - lost - unprot
}
