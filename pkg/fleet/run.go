package fleet

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// Key is where a machine ran: the cells of the fleet table.
type Key struct {
	Cloud        string `json:"cloud"`
	InstanceType string `json:"instance_type"`
	Zone         string `json:"zone"`
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%s", orDash(k.Cloud), orDash(k.InstanceType), orDash(k.Zone))
}

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Cloud, b.Cloud), cmp.Compare(a.InstanceType, b.InstanceType), cmp.Compare(a.Zone, b.Zone))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Cell is one run's time on machines of one Key, in seconds. Productive,
// Blocked, Lost, Restore and Unprotected are journal.Account's buckets; its "between"
// bucket is split into After (on the machine after an interruption, paid)
// and Gap (from a session's end to the next one's start, no machine,
// counted against the machine before the gap). Machine is the paid time:
// every bucket but Gap.
type Cell struct {
	Key
	Machine       float64 `json:"machine_s"`
	Productive    float64 `json:"productive_s"`
	Blocked       float64 `json:"blocked_s"`
	Lost          float64 `json:"lost_s"`
	Restore       float64 `json:"restore_s"`
	Unprotected   float64 `json:"unprotected_s,omitempty"` // no trainer connected: not goodput
	After         float64 `json:"after_s"`
	Gap           float64 `json:"gap_s"`
	Interruptions int     `json:"interruptions"`
	NoticeCommits int     `json:"notice_commits"`
	LostSteps     int64   `json:"lost_steps,omitempty"`
	// Restores counts the restores at the start of sessions on these
	// machines; RestoredFrom is their bytes by source (local, peer,
	// store: journal.RestoreEntry.From; none from a journal before it).
	Restores     int              `json:"restores,omitempty"`
	RestoredFrom map[string]int64 `json:"restored_from_bytes,omitempty"`
}

// Wall is the cell's share of the run's wall time.
func (c *Cell) Wall() float64 { return c.Machine + c.Gap }

func (c *Cell) add(o *Cell) {
	c.Machine += o.Machine
	c.Productive += o.Productive
	c.Blocked += o.Blocked
	c.Lost += o.Lost
	c.Restore += o.Restore
	c.Unprotected += o.Unprotected
	c.After += o.After
	c.Gap += o.Gap
	c.Interruptions += o.Interruptions
	c.NoticeCommits += o.NoticeCommits
	c.LostSteps += o.LostSteps
	c.Restores += o.Restores
	for src, n := range o.RestoredFrom {
		if c.RestoredFrom == nil {
			c.RestoredFrom = map[string]int64{}
		}
		c.RestoredFrom[src] += n
	}
}

// Event is one interruption of a run.
type Event struct {
	At        time.Time `json:"at"`               // detected
	Cell      int       `json:"cell"`             // index into Run.Cells
	Committed bool      `json:"committed"`        // the notice checkpoint committed
	Lead      *float64  `json:"lead_s,omitempty"` // notice → deadline, when both are known
	Lost      float64   `json:"lost_s"`
}

// Run is one run's contribution to the fleet, from its journal.
type Run struct {
	ID       string    `json:"id"`  // the journal's run_id, or its directory
	Dir      string    `json:"dir"` // the run's prefix under the fleet root ("" for the root)
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Sessions int       `json:"sessions"`
	// Steps is the newest training step known (latest.json, or the
	// journal's restores and interruptions): the progress the run kept.
	Steps  int64   `json:"steps"`
	Cells  []Cell  `json:"cells"`
	Events []Event `json:"events,omitempty"`
	// Damage names what a damaged journal lost (journal.Salvage);
	// the rest is counted.
	Damage []string `json:"damage,omitempty"`
	// Entries counts the journal's sessions and interruptions: a summary
	// keeps the entry computed from the fuller journal (RecordSession).
	Entries int `json:"entries"`

	// shares are each session's own part of its cell, in the journal's
	// order: what a session record adds to its pool's prior (records.go).
	shares []share
}

// share is one session's machine time, interruptions and committed
// notices, all in the cell of the machine it ran on.
type share struct {
	session string
	end     time.Time
	cell    int
	Tally
}

// Total is the run's cells added up (Key zero).
func (r *Run) Total() Cell {
	var t Cell
	for i := range r.Cells {
		t.add(&r.Cells[i])
	}
	return t
}

// RunOf is the run's contribution to the fleet as its journal j gives it
// (what a session record holds): for tools and the bench.
func RunOf(j *journal.Journal, dir string, steps int64, now time.Time) (*Run, error) {
	return runFromJournal(j, dir, steps, now)
}

// runFromJournal accounts j (journal.Account, with now ending a session
// that has none) and splits the result by the machine each session ran on.
// dir is the run's prefix under the fleet root; steps the newest committed
// step if known (0: the journal's newest).
func runFromJournal(j *journal.Journal, dir string, steps int64, now time.Time) (*Run, error) {
	g, err := journal.Account(j, now)
	if err != nil {
		return nil, err
	}
	sess := slices.Clone(j.Sessions)
	slices.SortStableFunc(sess, func(a, b journal.Session) int { return a.Start.Compare(b.Start) })
	r := &Run{ID: cmp.Or(j.RunID, dir), Dir: dir, Start: g.Start, End: g.End, Sessions: len(sess),
		Steps: steps, Entries: len(j.Sessions) + len(j.Interruptions)}
	cells := map[Key]int{}
	cellOf := func(k Key) int {
		i, ok := cells[k]
		if !ok {
			i = len(r.Cells)
			cells[k] = i
			r.Cells = append(r.Cells, Cell{Key: k})
		}
		return i
	}
	seen := map[int]bool{}
	prev := -1
	for i, gs := range g.Sessions {
		m := sess[i].Instance
		k := Key{m.Cloud, m.InstanceType, m.Zone}
		// Interruptions in this session, as Account places them.
		var ins []journal.Interruption
		for n, in := range j.Interruptions {
			if seen[n] || in.Detected.Before(gs.Start) || in.Detected.After(gs.End) {
				continue
			}
			seen[n] = true
			ins = append(ins, in)
		}
		if k.InstanceType == "" && k.Zone == "" && len(ins) > 0 {
			// An older agent's session without its machine: the notice knows it.
			k = Key{cmp.Or(k.Cloud, ins[0].Cloud), ins[0].InstanceType, ins[0].Zone}
		}
		c := cellOf(k)
		gap := 0.0
		if i > 0 {
			gap = max(gs.Start.Sub(g.Sessions[i-1].End).Seconds(), 0)
			r.Cells[prev].Gap += gap
		}
		cl := &r.Cells[c]
		sh := share{session: sess[i].ID, end: gs.End, cell: c, Tally: Tally{Machine: gs.Wall - gap}}
		cl.Machine += gs.Wall - gap
		cl.Productive += gs.Seconds[journal.BucketProductive]
		cl.Blocked += gs.Seconds[journal.BucketBlocked]
		cl.Lost += gs.Seconds[journal.BucketLost]
		cl.Restore += gs.Seconds[journal.BucketRestore]
		cl.Unprotected += gs.Seconds[journal.BucketUnprotected]
		cl.After += gs.Seconds[journal.BucketBetween] - gap
		for _, in := range ins {
			cl.Interruptions++
			sh.Interruptions++
			if in.CommitOK {
				cl.NoticeCommits++
				sh.NoticeCommits++
			}
			cl.LostSteps += in.LostSteps
			e := Event{At: in.Detected, Cell: c, Committed: in.CommitOK, Lost: in.LostSeconds}
			if in.Deadline != nil && !in.Notice.IsZero() {
				lead := in.Deadline.Sub(in.Notice).Seconds()
				e.Lead = &lead
			}
			r.Events = append(r.Events, e)
			r.Steps = max(r.Steps, in.Step)
		}
		r.shares = append(r.shares, sh)
		prev = c
	}
	for _, rs := range j.Restores {
		r.Steps = max(r.Steps, rs.Step)
		if len(r.shares) == 0 {
			continue
		}
		// A restore belongs to the session it started: the last one that
		// began at or before it (the first, for one logged earlier).
		c := r.shares[0].cell
		for i, gs := range g.Sessions {
			if !gs.Start.After(rs.At) {
				c = r.shares[i].cell
			}
		}
		r.Cells[c].add(&Cell{Restores: 1, RestoredFrom: rs.From})
	}
	return r, nil
}
