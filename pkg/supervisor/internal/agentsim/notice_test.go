package agentsim

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// A notice's edges (issue 49: the end-to-end TestNotice_AzureAckAfterCommit
// and TestNotice_DuringPeriodicUpload were cut; these hold their
// guarantees), in the sessions of one agent (hosted and run mode; not part
// mode):
//
//   - Azure (half of the sessions): the agent's cloud source is a
//     simulated Azure metadata service (simAzure, a metadata.Acker), the
//     notice a Scheduled Event of it. Its acknowledgement (the POST the
//     real source sends; its body is pkg/metadata/azure's TestWatch) comes
//     only once the interruption checkpoint is committed: at the ack,
//     latest.json names a checkpoint at least as new as an interruption
//     checkpoint whose manifest landed after the notice, and latest.json
//     was written after that manifest (sawAck); the ack names the notice,
//     comes once, before the notice's deadline (or the best effort's, 10 s,
//     for a notice the loop heard past it); and when a trainer was told an
//     interruption checkpoint committed, the ack came (noticeEnd). The
//     simulated service answers the ack, fails it or never answers (until
//     the agent gives up at the deadline): the agent's end is bounded all
//     the same (the end's bound, agentsim_test.go).
//   - A periodic upload in flight when the interruption checkpoint's
//     upload begins is cancelled: no periodic checkpoint's manifest lands
//     after the interruption checkpoint's first object reached the store
//     (checked in every session of one agent, at each landing).
//   - Held (a quarter of the sessions with a notice): the store holds the
//     session's first periodic upload (its objects' puts wait until their
//     context ends, up to holdFor), and the notice comes 0-3 s into the
//     hold rather than at its drawn time (none when a signal came first);
//     no store faults in such a session. Checked besides (noticeEnd): the
//     interruption checkpoint is asked for within 1 s of the notice (when
//     a trainer that answered the held request is connected, none waits
//     on a restore, no request is pending and no signal came); when every
//     rank asked for it said done in time (and before any signal),
//     latest.json names it by its deadline and still does at the session's
//     end, and the journal records it committed before the deadline; and
//     the held periodic checkpoint never commits once the
//     interruption checkpoint's upload began (one never answered leaves it
//     to commit: the agent cancels it only for that upload).
//
// Drawn from a generator of their own (drawNoticeShape), so that the
// schedules' other draws stay what they were.

// noticeShape is what a session draws for its notice's edges.
type noticeShape struct {
	azure bool
	ack   ackMode
	held  bool          // the first periodic upload held, the notice during it
	delay time.Duration // from the hold's start to the notice
}

// ackMode is what the simulated Azure metadata service does with an ack.
type ackMode int

const (
	ackOK ackMode = iota
	ackFails
	ackHangs // until the agent's context for it ends
)

func (m ackMode) String() string { return [...]string{"ok", "fails", "hangs"}[m] }

// holdFor bounds a held periodic upload (the agent cancels it sooner).
const holdFor = 2 * time.Minute

func drawNoticeShape(seed uint64, k int, notice bool) noticeShape {
	r := rand.New(rand.NewPCG(seed^0xac4e, uint64(k)))
	s := noticeShape{azure: r.IntN(2) == 0, ack: pick(r, ackOK, ackOK, ackOK, ackOK, ackFails, ackHangs)}
	held := r.IntN(4) == 0
	s.delay = time.Duration(r.IntN(3000)) * time.Millisecond
	s.held = notice && held
	return s
}

func (s noticeShape) String() string {
	var parts []string
	if s.azure {
		parts = append(parts, "azure ack="+s.ack.String())
	}
	if s.held {
		parts = append(parts, "notice during a held periodic upload (+"+s.delay.String()+")")
	}
	if len(parts) == 0 {
		return ""
	}
	return " notice-edges(" + strings.Join(parts, ", ") + ")"
}

// noticeState is one session's notice, its ack and its interruption
// checkpoint (under w.mu).
type noticeState struct {
	shape noticeShape
	id    string
	sent  time.Time // when the host sent the notice; zero: not (yet)
	// deadline is the notice's.
	deadline time.Time
	signalAt time.Time   // the host's first signal; zero: none yet
	loopAt   time.Time   // when the agent's loop ran (it hears notices from then)
	acks     []time.Time // the agent's acks
	// interruptID is the first request asked with reason interruption;
	// firstPut, when each interruption request's first object reached
	// the store.
	interruptID string
	askedAt     time.Time // when interruptID was first asked
	// expectAsk: at the notice, a rank that answered the held request was
	// still connected, none was waiting on a restore, no signal had come
	// and no request was pending: the agent must ask for the interruption
	// checkpoint at once.
	expectAsk bool
	firstPut  map[string]time.Time
	told      map[string]bool // requests a trainer was told are committed
	latestOf  map[string]time.Time
	// The hold: armed until the host's first event; heldID the periodic
	// request held; held closed when the hold began.
	armed   bool
	heldID  string
	heldAt  time.Time
	held    chan struct{}
	checked bool // the held session's liveness check applied
}

// noticeChecked counts what the checks here checked, over a TestAgentSim
// run: acks, held sessions, held sessions whose interruption checkpoint
// was answered in time (the liveness check applied).
var noticeChecked struct{ acks, held, live atomic.Int64 }

// noticeStart: session k begins (w.mu not held).
func (w *world) noticeStart(shape noticeShape) *noticeState {
	ns := &noticeState{shape: shape, firstPut: map[string]time.Time{}, told: map[string]bool{}, latestOf: map[string]time.Time{},
		armed: shape.held, held: make(chan struct{})}
	w.mu.Lock()
	w.ns = ns
	if w.reasonOf == nil {
		w.reasonOf = map[string]string{}
	}
	w.mu.Unlock()
	return ns
}

// noticeSent: the host sent notice n (w.mu not held).
func (w *world) noticeSent(n metadata.Notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ns := w.ns
	if ns == nil {
		return
	}
	ns.id, ns.sent, ns.deadline, ns.armed = n.ID, n.Detected, n.Deadline, false
	if ns.heldID == "" || !ns.signalAt.IsZero() {
		return
	}
	for _, a := range w.asked[ns.heldID] {
		if !a.done.IsZero() && a.left.IsZero() {
			ns.expectAsk = true
		}
	}
	if p := w.prog; p != nil {
		for _, ready := range p.conns {
			if !ready {
				ns.expectAsk = false // a restore for it runs: nothing worth saving (the agent's trainers())
			}
		}
	}
	for _, as := range w.asked {
		for _, a := range as {
			if a.done.IsZero() && a.left.IsZero() && a.deadline.After(n.Detected) {
				ns.expectAsk = false // pending: it becomes the interruption checkpoint
			}
		}
	}
}

// noticeSentAt is when the host sent the session's notice, from start;
// -1: never (w.mu not held).
func (w *world) noticeSentAt(start time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ns == nil || w.ns.sent.IsZero() {
		return -1
	}
	return w.ns.sent.Sub(start)
}

// noticeLoop: the agent's loop runs (w.mu not held).
func (w *world) noticeLoop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ns := w.ns; ns != nil {
		ns.loopAt = time.Now()
	}
}

// lateNoticeGrace is the agent's best effort for a notice it hears past
// its deadline (pkg/supervisor stop.go).
const lateNoticeGrace = 10 * time.Second

// signalSent: the host sent a signal (w.mu not held).
func (w *world) signalSent() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ns := w.ns; ns != nil {
		ns.armed = false
		if ns.signalAt.IsZero() {
			ns.signalAt = time.Now()
		}
	}
}

// noticeAsked: a trainer was asked for request id with reason (w.mu held).
func (w *world) noticeAsked(id, reason string) {
	if _, ok := w.reasonOf[id]; !ok {
		w.reasonOf[id] = reason
	}
	if ns := w.ns; ns != nil && reason == protocol.ReasonInterruption && ns.interruptID == "" {
		ns.interruptID, ns.askedAt = id, time.Now()
	}
}

// noticeCommitted: a trainer was told request id is committed (w.mu held).
func (w *world) noticeCommitted(id string) {
	if ns := w.ns; ns != nil {
		ns.told[id] = true
	}
}

// objectOf is the request id of a checkpoint object's key.
var objectOf = regexp.MustCompile(`^` + regexp.QuoteMeta(checkpoint.CheckpointsDir) + `[0-9]{12}-([0-9a-f]{12})/`)

// noticeBefore: a put of key is about to reach the store. It records an
// interruption checkpoint's first object, and holds the session's first
// periodic upload (held sessions) until ctx ends (its error: the put
// fails) or holdFor passes.
func (w *world) noticeBefore(ctx context.Context, key string) error {
	m := objectOf.FindStringSubmatch(key)
	if m == nil {
		return nil
	}
	id := m[1]
	w.mu.Lock()
	ns := w.ns
	if ns == nil {
		w.mu.Unlock()
		return nil
	}
	reason := w.reasonOf[id]
	if reason == protocol.ReasonInterruption {
		if _, ok := ns.firstPut[id]; !ok {
			ns.firstPut[id] = time.Now()
		}
	}
	hold := false
	switch {
	case ns.heldID == id:
		hold = true
	case ns.armed && ns.heldID == "" && reason == protocol.ReasonPeriodic && !strings.HasSuffix(key, "/"+checkpoint.ManifestName):
		ns.heldID, ns.heldAt, hold = id, time.Now(), true
		close(ns.held)
		w.logLocked("store: holding the periodic upload of %s", id)
	}
	until := ns.heldAt.Add(holdFor)
	w.mu.Unlock()
	if !hold {
		return nil
	}
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// noticeLanded: a put of key landed with body. A periodic checkpoint's
// manifest must not land after an interruption checkpoint's first object
// did: its upload was to be cancelled.
func (w *world) noticeLanded(key string, body []byte) {
	if !strings.HasSuffix(key, "/"+checkpoint.ManifestName) || objectOf.FindStringSubmatch(key) == nil {
		return
	}
	var m checkpoint.Manifest
	if json.Unmarshal(body, &m) != nil || m.Reason != protocol.ReasonPeriodic {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	ns := w.ns
	if ns == nil {
		return
	}
	for id, at := range ns.firstPut {
		if now.After(at) {
			w.violateLocked("periodic checkpoint %s (step %d) committed %s after the interruption checkpoint %s began its upload: the periodic upload in flight was not cancelled",
				m.ID, m.Step, now.Sub(at), id)
		}
	}
}

// noticeLatest: latest.json was written naming id (w.mu held).
func (w *world) noticeLatest(id string) {
	if ns := w.ns; ns != nil {
		if _, ok := ns.latestOf[id]; !ok {
			ns.latestOf[id] = time.Now()
		}
	}
}

// simAzure is the Azure metadata service as the agent sees it: the
// source's Ack (the notices come on Hosted.Notices).
type simAzure struct {
	w    *world
	mode ackMode
}

var _ metadata.Acker = (*simAzure)(nil)

func (a *simAzure) Cloud() metadata.Cloud { return metadata.CloudAzure }

func (a *simAzure) Identity(context.Context) (metadata.Identity, error) {
	return metadata.Identity{Cloud: metadata.CloudAzure}, nil
}

func (a *simAzure) Watch(ctx context.Context, _ chan<- metadata.Notice) error {
	<-ctx.Done()
	return nil
}

func (a *simAzure) Ack(ctx context.Context, id string) error {
	a.w.sawAck(id)
	switch a.mode {
	case ackFails:
		return errors.New("scheduled events: 500 internal server error")
	case ackHangs:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// sawAck checks the agent's acknowledgement of notice id, as it arrives.
func (w *world) sawAck(id string) {
	noticeChecked.acks.Add(1)
	latest, latestOK := w.peekLatest()
	ms := w.manifests()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	ns := w.ns
	w.logLocked("metadata: ack %s", id)
	if ns == nil || ns.sent.IsZero() || id != ns.id {
		w.violateLocked("the agent acknowledged event %q, which is not the session's notice", id)
		return
	}
	ns.acks = append(ns.acks, now)
	if len(ns.acks) > 1 {
		w.violateLocked("event %s acknowledged %d times", id, len(ns.acks))
	}
	// By the stop's deadline: the notice's, or the best effort's when the
	// loop heard it at or past it (a long start; at it exactly, the agent
	// finds the deadline passed too: seed 178239).
	if dl := ns.deadline; !now.Before(dl) && (ns.loopAt.IsZero() || ns.loopAt.Before(dl) || !now.Before(ns.loopAt.Add(lateNoticeGrace))) {
		w.violateLocked("event %s acknowledged %s after the notice's deadline (the loop ran %s after it)", id, now.Sub(dl), ns.loopAt.Sub(dl))
	}
	// The interruption checkpoint: a manifest of reason interruption that
	// landed after the notice; latest.json written since, naming it or a
	// newer step.
	var ic *checkpoint.Manifest
	for _, m := range ms {
		if at, ok := w.committedAt[m.ID]; ok && m.Reason == protocol.ReasonInterruption && !at.Before(ns.sent) && (ic == nil || m.Step > ic.Step) {
			ic = m
		}
	}
	switch {
	case ic == nil:
		w.violateLocked("event %s acknowledged with no interruption checkpoint committed since the notice %s ago (latest.json: %s)", id, now.Sub(ns.sent), latestDesc(latest, latestOK))
	case !latestOK || latest.Step < ic.Step:
		w.violateLocked("event %s acknowledged before latest.json named the interruption checkpoint %s (step %d): latest.json %s", id, ic.ID, ic.Step, latestDesc(latest, latestOK))
	case ns.latestOf[latest.ID].Before(w.committedAt[ic.ID]):
		w.violateLocked("event %s acknowledged while latest.json (%s) was written before the interruption checkpoint %s landed", id, latestDesc(latest, latestOK), ic.ID)
	}
}

func latestDesc(l checkpoint.Latest, ok bool) string {
	if !ok {
		return "absent"
	}
	return l.ID + " step " + strconv.FormatInt(l.Step, 10)
}

// peekLatest reads latest.json without faults.
func (w *world) peekLatest() (checkpoint.Latest, bool) {
	var l checkpoint.Latest
	b, ok := w.st.Peek(checkpoint.LatestKey)
	if !ok || json.Unmarshal(b, &l) != nil || l.Manifest == "" {
		return checkpoint.Latest{}, false
	}
	return l, true
}

// noticeEnd checks the session's notice once its agent ended (w.mu not
// held): the ack came for an interruption checkpoint a trainer was told
// committed; in a held session, an interruption checkpoint answered in
// time committed by its deadline, is the newest, and the held periodic
// checkpoint never committed.
func (w *world) noticeEnd() {
	ms := w.manifests()
	latest, latestOK := w.peekLatest()
	j, jerr := journal.Read(context.Background(), w.st, "sim")
	w.mu.Lock()
	defer w.mu.Unlock()
	ns := w.ns
	w.ns = nil
	if ns == nil || ns.sent.IsZero() {
		return
	}
	byID := map[string]*checkpoint.Manifest{}
	for _, m := range ms {
		byID[m.ID] = m
	}
	if ns.shape.azure && len(ns.acks) == 0 {
		for id := range ns.told {
			if m := byID[id]; m != nil && m.Reason == protocol.ReasonInterruption {
				w.violateLocked("a trainer was told the interruption checkpoint %s (step %d) committed, but event %s was never acknowledged", id, m.Step, ns.id)
			}
		}
	}
	if !ns.shape.held || ns.heldID == "" {
		return
	}
	noticeChecked.held.Add(1)
	if m := byID[ns.heldID]; m != nil && len(ns.firstPut) > 0 {
		// Cancelled when the interruption checkpoint's upload begins: one
		// never answered leaves it to commit (the agent's design).
		w.violateLocked("the periodic checkpoint %s held in flight at the notice committed (step %d) though the interruption checkpoint's upload began: the periodic upload was not cancelled", ns.heldID, m.Step)
	}
	id := ns.interruptID
	if ns.expectAsk && (id == "" || ns.askedAt.Sub(ns.sent) > time.Second) {
		w.violateLocked("the notice came while a periodic upload was held in flight and a trainer was connected, but no interruption checkpoint was asked for within 1s (asked: %q after %s)", id, ns.askedAt.Sub(ns.sent))
	}
	if id == "" || len(w.asked[id]) == 0 {
		return
	}
	var dl, last time.Time
	for _, a := range w.asked[id] {
		if a.done.IsZero() || !a.done.Before(a.deadline) || (!ns.signalAt.IsZero() && !a.done.Before(ns.signalAt)) {
			return // not answered in time by every rank asked: it may fail
		}
		if dl.IsZero() || a.deadline.Before(dl) {
			dl = a.deadline
		}
		if a.done.After(last) {
			last = a.done
		}
	}
	noticeChecked.live.Add(1)
	at, ok := ns.latestOf[id]
	switch {
	case !ok:
		w.violateLocked("every rank said done for the interruption checkpoint %s in time (the last %s before its deadline), with a periodic upload held in flight, but latest.json never named it", id, dl.Sub(last))
	case at.After(dl):
		w.violateLocked("the interruption checkpoint %s reached latest.json %s after its deadline", id, at.Sub(dl))
	case !latestOK || latest.ID != id:
		w.violateLocked("at the session's end latest.json is %s, not the interruption checkpoint %s", latestDesc(latest, latestOK), id)
	}
	// The journal records it (no store faults in a held session).
	var in *journal.Interruption
	if jerr == nil {
		for i := range j.Interruptions {
			if j.Interruptions[i].NoticeID == ns.id {
				in = &j.Interruptions[i]
			}
		}
	}
	switch {
	case in == nil:
		w.violateLocked("the journal has no interruption for notice %s (read: %v)", ns.id, jerr)
	case in.CheckpointID != id || !in.CommitOK || in.Committed == nil || in.Deadline == nil || !in.Committed.Before(*in.Deadline):
		w.violateLocked("the journal's interruption for notice %s is %+v: want checkpoint %s committed before the deadline", ns.id, *in, id)
	}
}
