package agentsim

import (
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Progress (liveness): the safety checks of agentsim_test.go pass for an
// agent that abandons every checkpoint (never commits, never asks), so
// two bounds derived from the agent's documented behaviour are checked
// where nothing excuses a miss: a quiet stretch of a session, in which
// no store fault was injected (nor in the faultShadow before it), no
// trainer connected or left or was handed a resume, every connected
// trainer was handed its resume (none waits on a restore), and no
// notice, signal, kill or second copy of a node came.
//
//   - asks (single-node and run mode): a request reaches the trainers
//     at least every interval + request-timeout + uploadPoll of such a
//     stretch (from its start, then from each request). The schedule
//     (pkg/schedule Scheduler.Next; the simulation fixes the interval,
//     --interval, so the adaptive one and maintenance play no part)
//     asks interval after the trainer last stopped being blocked (its
//     done, failed, resume, start); a request pending is settled by its
//     deadline (request-timeout after it was sent), an expired one does
//     not move that mark (the next is due at once); while an upload is
//     in flight Next looks uploadPoll ahead, and a quiet store's upload
//     takes no fake time. Part mode is left out: a node's commit in
//     flight waits for the other nodes' parts, up to the commit's bound
//     (10 minutes) when one of their ranks never answers, and its
//     agent asks nothing meanwhile;
//   - commits (every mode): a request every rank asked answered with
//     done in time (in part mode every rank of the job), none of the
//     session's trainers leaving and no store fault (nor in the
//     faultShadow before it) from the request to uploadBound after the
//     last done, no stop, kill or copy by then, has its manifest in the
//     store by uploadBound after the last done. settle commits once no
//     rank owes an answer (request.go); a quiet store answers at once,
//     and a job's parts are joined within a poll (≤ 1 s) of the last,
//     a part without rank 0 assembling after assembleAfter (5 s) at
//     worst (pkg/checkpoint/commit/parts.go).
//
// Measured over seeds 1-15,000 of the real agent: the longest wait for a
// request in a quiet stretch 3m23.6s against a bound of 3m35s (interval
// 90 s, request-timeout 2 m: the answer came just before its deadline),
// the longest from a last done to its manifest under 1 s. Planted bugs
// that only these checks catch (the others pass with them), of the first
// 2,000 seeds: settle never committing a single-node periodic checkpoint
// (commits: 918 seeds, 5, 7, 11 the first), a node without rank 0 never
// writing its part (commits, part mode: 103 seeds, 1, 57, 66 the
// first), every wake of the loop restarting the schedule's interval, so
// that no periodic request is ever due (asks: 782 seeds, 3, 5, 7 the
// first).

// uploadPoll is pkg/schedule's look-ahead while an upload is in flight.
const uploadPoll = 5 * time.Second

// uploadBound is how long after a request's last done its manifest may
// take to land in a quiet store: generous (the store takes no fake time;
// a job's parts are joined within a second or two, 5 s at worst).
const uploadBound = 30 * time.Second

// faultShadow is how long an injected store fault may still hold the
// agent up: a slow operation (30 s at most) in flight, a retry's backoff
// (5 s at most, internal/retry).
const faultShadow = 60 * time.Second

// progress is one session's account for the progress checks (under w.mu).
type progress struct {
	interval, reqTimeout time.Duration
	asks                 bool // the asks check applies (not part mode)
	loopUp               bool
	over                 time.Time // a stop, kill, copy or the agent's end: zero until then
	since                time.Time // the quiet stretch's start (may be ahead: a fault's shadow)
	lastAsk              time.Time
	conns                map[*trainer]bool // connected trainers: handed their resume or not
	faults               []time.Time
	leaves               []time.Time
	reqs                 map[string]time.Time // request id → when it first reached a trainer
}

// manifestPut is a manifest's key: its checkpoint's id.
var manifestPut = regexp.MustCompile(`^` + regexp.QuoteMeta(checkpoint.CheckpointsDir) + `[0-9]{12}-([0-9a-f]{12})/` + regexp.QuoteMeta(checkpoint.ManifestName) + `$`)

// progStart: a session begins (w.mu not held); asks: the asks check
// applies to it.
func (w *world) progStart(interval, reqTimeout time.Duration, asks bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prog = &progress{interval: interval, reqTimeout: reqTimeout, asks: asks, since: time.Now(),
		conns: map[*trainer]bool{}, reqs: map[string]time.Time{}}
	if w.committedAt == nil {
		w.committedAt = map[string]time.Time{}
	}
}

// asking: the asks check holds now (w.mu held).
func (p *progress) asking() bool {
	if !p.asks || !p.loopUp || !p.over.IsZero() || len(p.conns) == 0 {
		return false
	}
	for _, ready := range p.conns {
		if !ready {
			return false
		}
	}
	return true
}

// progCheck checks the asks bound up to now, before an event changes the
// state (mu held).
func (w *world) progCheck(now time.Time) {
	p := w.prog
	if p == nil || !p.asking() {
		return
	}
	from := p.since
	if p.lastAsk.After(from) {
		from = p.lastAsk
	}
	if now.Sub(from) > p.interval {
		progChecked.asks.Add(1) // a stretch long enough that a request was due in it
	}
	if gap := p.interval + p.reqTimeout + uploadPoll; now.Sub(from) > gap {
		w.violateLocked("progress: no checkpoint request for %s (from %.3fs), in a quiet stretch with %d trainer(s) connected and resumed: the bound is interval %s + request-timeout %s + %s",
			now.Sub(from).Round(time.Millisecond), from.Sub(w.t0).Seconds(), len(p.conns), p.interval, p.reqTimeout, uploadPoll)
		p.lastAsk = now // one report per gap
	}
}

// progEvent: something that ends a quiet stretch happened (mu held).
func (w *world) progEvent(now time.Time) {
	w.progCheck(now)
	if p := w.prog; p != nil && now.After(p.since) {
		p.since = now
	}
}

func (w *world) progHello(t *trainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.progEvent(time.Now())
	if w.prog != nil {
		w.prog.conns[t] = false
	}
}

// progReady: t was handed its resume (or a fresh start).
func (w *world) progReady(t *trainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.progEvent(time.Now())
	if p := w.prog; p != nil {
		if _, ok := p.conns[t]; ok {
			p.conns[t] = true
		}
	}
}

func (w *world) progLeave(t *trainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.progEvent(now)
	if p := w.prog; p != nil {
		delete(p.conns, t)
		p.leaves = append(p.leaves, now)
	}
}

// progAsk: request id reached a trainer.
func (w *world) progAsk(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.progCheck(now)
	if p := w.prog; p != nil {
		p.lastAsk = now
		if _, ok := p.reqs[id]; !ok {
			p.reqs[id] = now
		}
	}
}

// progLoop: the (asking) agent's loop runs.
func (w *world) progLoop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.progEvent(time.Now())
	if w.prog != nil {
		w.prog.loopUp = true
	}
}

// progFault: a store fault was injected (mu held).
func (w *world) progFault() {
	p := w.prog
	if p == nil {
		return
	}
	now := time.Now()
	w.progCheck(now)
	p.faults = append(p.faults, now)
	if s := now.Add(faultShadow); s.After(p.since) {
		p.since = s
	}
}

// progOver: a notice, a signal, a kill, a second copy or the agent's end:
// no progress is owed from now on.
func (w *world) progOver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.prog; p != nil && p.over.IsZero() {
		w.progCheck(time.Now())
		p.over = time.Now()
	}
}

// progManifest: a put of key landed; a manifest's records when its
// checkpoint committed.
func (w *world) progManifest(key string) {
	m := manifestPut.FindStringSubmatch(key)
	if m == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.committedAt[m[1]]; !ok {
		w.committedAt[m[1]] = time.Now()
	}
}

// progEnd checks the commits bound for the session's requests (w.mu not
// held): the session's agents have ended.
func (w *world) progEnd() {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.prog
	if p == nil {
		return
	}
	if p.over.IsZero() {
		p.over = time.Now()
	}
	everyRank := 0
	if w.job.nodes > 0 {
		everyRank = w.job.nodes * w.job.local
	}
	quiet := func(ts []time.Time, from, to time.Time) bool {
		return !slices.ContainsFunc(ts, func(t time.Time) bool { return !t.Before(from) && !t.After(to) })
	}
	for _, id := range slices.Sorted(mapsKeys(p.reqs)) {
		asked := w.asked[id]
		if len(asked) == 0 || (everyRank > 0 && len(asked) != everyRank) {
			continue
		}
		var last time.Time
		answered := true
		for _, a := range asked {
			if a.done.IsZero() || !a.done.Before(a.deadline) {
				answered = false
			}
			if a.done.After(last) {
				last = a.done
			}
		}
		first := p.reqs[id]
		by := last.Add(uploadBound)
		if !answered || !by.Before(p.over) || !quiet(p.leaves, first, by) || !quiet(p.faults, first.Add(-faultShadow), by) {
			continue
		}
		progChecked.commits.Add(1)
		if at, ok := w.committedAt[id]; !ok || at.After(by) {
			got := "never"
			if ok {
				got = at.Sub(w.t0).String()
			}
			w.violateLocked("progress: request %s (sent %.3fs), answered in time by every rank asked (%d, the last at %.3fs), no fault, no trainer gone, no stop: its manifest is not in the store by %s after the last done (landed: %s)",
				id, first.Sub(w.t0).Seconds(), len(asked), last.Sub(w.t0).Seconds(), uploadBound, got)
		}
	}
	w.prog = nil
}

// progChecked counts what the progress checks checked, over every schedule
// of a run: TestAgentSim logs it, and fails a run of simShort schedules or
// more where either is none (the checks' conditions never held: vacuous).
var progChecked struct{ commits, asks atomic.Int64 }
