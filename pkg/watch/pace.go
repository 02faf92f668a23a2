package watch

import (
	"slices"
	"time"
)

// paceSaves is how many of the newest checkpoints the rate is taken over:
// enough to smooth one slow save, few enough to follow a trainer whose
// pace changes (evaluation, a new phase).
const paceSaves = 4

// Pace is a trainer's step rate as its checkpoints show it: in zero-code
// mode the trainer reports nothing, and its checkpoints' steps and write
// times are all the agent sees of its progress. Pure and clock-free.
type Pace struct {
	saves []save // by step, at most paceSaves
}

type save struct {
	step int64
	at   time.Time
}

// Add records that the checkpoint of step was written at (its newest
// mtime); a step seen before keeps its first time.
func (p *Pace) Add(step int64, at time.Time) {
	i, found := slices.BinarySearchFunc(p.saves, step, func(s save, step int64) int {
		switch {
		case s.step < step:
			return -1
		case s.step > step:
			return 1
		}
		return 0
	})
	if found {
		return
	}
	p.saves = slices.Insert(p.saves, i, save{step, at})
	if len(p.saves) > paceSaves {
		p.saves = p.saves[len(p.saves)-paceSaves:]
	}
}

// Reset forgets every checkpoint (the trainer starts again, from a
// restored one).
func (p *Pace) Reset() { p.saves = p.saves[:0] }

// At is the step the trainer reached at t, extrapolated from its newest
// checkpoint at the rate between the oldest and newest kept; false with
// fewer than two checkpoints, or times that do not give a rate.
func (p *Pace) At(t time.Time) (int64, bool) {
	if len(p.saves) < 2 {
		return 0, false
	}
	first, last := p.saves[0], p.saves[len(p.saves)-1]
	span := last.at.Sub(first.at)
	if span <= 0 {
		return 0, false
	}
	rate := float64(last.step-first.step) / span.Seconds()
	since := max(t.Sub(last.at), 0)
	return last.step + int64(rate*since.Seconds()), true
}
