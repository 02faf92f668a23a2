package fleet

import (
	"fmt"
	"math"
	"time"

	"github.com/spotagent/spotagent/pkg/schedule"
)

// DefaultMinHours is how many machine hours a cell needs before its
// observed rate replaces the flat --interruption-rate as a new run's prior.
// At 48 h a rate of 0.02/h has been seen about once: below that, the flat
// prior (worth 24 h) is as good a guess as the fleet's.
const DefaultMinHours = 48

// priorHours is what the flat rate is worth in PriorRate: the scheduler's
// own prior weight (schedule.Scheduler, one day of run time).
const priorHours = 24

// maxPriorHours caps the weight of the fleet's experience in a run's
// scheduler (Seed): at most this many machine hours, its counts scaled
// down, so that a run whose own interruptions disagree (a cell whose rate
// changed) moves its estimate within days.
const maxPriorHours = 1000

// Prior is what a new run's scheduler starts from: the fleet's
// interruptions and notice commits on machines like its own.
type Prior struct {
	// Rate is the prior mean of the interruption rate the scheduler ends
	// up with: PriorRate(flat, interruptions, hours) after Seed's cap.
	Rate          float64 `json:"rate_per_hour"`
	Source        string  `json:"source"` // "zone", "instance type" or "flag"
	Key           Key     `json:"key"`
	Hours         float64 `json:"hours"` // machine hours behind Rate (0: the flag)
	Interruptions int     `json:"interruptions"`
	NoticeCommits int     `json:"notice_commits"`
}

// Seed adds the fleet's experience to the history a run's scheduler
// starts from (schedule.Scheduler.ObserveHistory), as if the run had
// lived it: run time, interruptions and committed notices, capped at
// maxPriorHours with the counts scaled alike. The interruption rate then
// starts near the fleet's (the --interruption-rate prior keeps its one
// day of weight) and so does the notice-success estimate p, which a flat
// prior cannot know. A flag prior returns h unchanged. Never write the
// result to the journal: it is a prior, not the run's history.
func (p Prior) Seed(h schedule.History) schedule.History {
	if p.Source == "flag" || p.Hours <= 0 {
		return h
	}
	hours, k, c := p.scaled()
	h.RunTime += time.Duration(hours * float64(time.Hour))
	h.Interruptions += k
	h.NoticeCommitted += c
	return h
}

func (p Prior) scaled() (hours float64, k, c int) {
	f := min(1, maxPriorHours/p.Hours)
	return p.Hours * f, int(math.Round(float64(p.Interruptions) * f)), int(math.Round(float64(p.NoticeCommits) * f))
}

func (p Prior) String() string {
	switch p.Source {
	case "flag":
		return fmt.Sprintf("%.4g/h from --interruption-rate (the fleet has too few hours on %s)", p.Rate, p.Key)
	default:
		return fmt.Sprintf("%.4g/h from the fleet: %d interruption(s), %d with the notice checkpoint committed, in %.0f machine hours on %s (%s)",
			p.Rate, p.Interruptions, p.NoticeCommits, p.Hours, p.Key, p.Source)
	}
}

// PriorRate is the flat rate updated with the fleet's interruptions in
// hours on machines: the posterior mean of a gamma prior with mean flat
// worth a day, (flat·24 + k) / (24 + hours). With many hours it is the
// observed k/hours; it is never 0 while flat > 0.
func PriorRate(flat float64, interruptions int, hours float64) float64 {
	return (flat*priorHours + float64(interruptions)) / (priorHours + hours)
}

// PriorFor is the prior rate for a new run on machines of k: the fleet's
// own cell (cloud, instance type, zone) when it has minHours of machine
// time, else the instance type over all zones of the cloud, else flat
// (--interruption-rate). s may be nil (no summary yet). An agent reads
// only its pool's records instead (PriorFrom).
func PriorFor(s *Summary, k Key, flat, minHours float64) Prior {
	var zone, typ Tally
	if s != nil {
		for _, r := range s.Runs {
			for i := range r.Cells {
				c := &r.Cells[i]
				if c.Cloud != k.Cloud || c.InstanceType != k.InstanceType {
					continue
				}
				t := Tally{Machine: c.Machine, Interruptions: c.Interruptions, NoticeCommits: c.NoticeCommits}
				typ.add(t)
				if c.Zone == k.Zone {
					zone.add(t)
				}
			}
		}
	}
	return priorOf(zone, typ, k, flat, minHours)
}

// priorOf is the prior of k from the fleet's tallies on k's zone and on
// its instance type over the cloud's zones.
func priorOf(zone, typ Tally, k Key, flat, minHours float64) Prior {
	for _, c := range []struct {
		t      *Tally
		source string
	}{{&zone, "zone"}, {&typ, "instance type"}} {
		if h := c.t.Machine / 3600; h >= minHours && k.InstanceType != "" {
			p := Prior{Source: c.source, Key: k, Hours: h, Interruptions: c.t.Interruptions, NoticeCommits: c.t.NoticeCommits}
			sh, sk, _ := p.scaled()
			p.Rate = PriorRate(flat, sk, sh)
			return p
		}
	}
	return Prior{Rate: flat, Source: "flag", Key: k}
}
