package commit

import (
	"sync"
	"time"
)

// earlyPace decides whether a pipeline uploads files as they are reported
// saved (early) or only at done (deferred, the serial path), from what
// each choice cost on this machine before.
//
// Early uploads overlap the trainer's write, but they also compete with it
// for the same CPUs, memory bandwidth and disk: on a 2-core machine a 1 GiB
// pipelined commit was faster than the serial one on one CPU model (2.71 s
// against 3.75 s) and slower on another (3.38 s against 3.21 s: the upload
// took 3.04 s against 2.45 s alone, while the write it overlapped took
// 0.67 s). Which wins is a property of the machine and the trainer, so it
// is measured, not assumed: each choice is scored by the time from the
// first file reported saved to every byte durable, per byte (both choices
// include the trainer's write in that window), and the faster one is used.
// The first pipeline uploads early (the behaviour before this policy), the
// second defers, and every reprobeEvery-th pipeline after that tries the
// slower choice again, so that a change (another store, a bigger
// checkpoint) is noticed. Checkpoints below paceMinBytes are not scored:
// their time is mostly fixed costs.
type earlyPace struct {
	mu      sync.Mutex
	perByte [2]float64 // seconds per byte, [deferred, early]; 0: not measured
	n       int        // pipelines decided
}

// paceState is c's pace, created at its first use (a Committer is a
// struct literal) or given by OnStore (its committers share c's).
func (c *Committer) paceState() *earlyPace {
	c.paceOnce.Do(func() {
		if c.pace == nil {
			c.pace = &earlyPace{}
		}
	})
	return c.pace
}

const (
	paceDeferred = 0
	paceEarly    = 1
	reprobeEvery = 8
	paceMinBytes = 64 << 20
	paceWeight   = 0.5 // weight of a new score against the old
)

// early decides for a new pipeline.
func (e *earlyPace) early() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	d, x := e.perByte[paceDeferred], e.perByte[paceEarly]
	switch {
	case x == 0:
		return true
	case d == 0:
		return false
	case e.n%reprobeEvery == 0:
		return x > d // the slower one, measured again
	default:
		return x <= d
	}
}

// record scores a pipeline that uploaded bytes and had them all durable
// took after its first file was reported saved.
func (e *earlyPace) record(early bool, bytes int64, took time.Duration) {
	if bytes < paceMinBytes || took <= 0 {
		return
	}
	arm := paceDeferred
	if early {
		arm = paceEarly
	}
	s := took.Seconds() / float64(bytes)
	e.mu.Lock()
	defer e.mu.Unlock()
	if old := e.perByte[arm]; old > 0 {
		s = paceWeight*s + (1-paceWeight)*old
	}
	e.perByte[arm] = s
}
