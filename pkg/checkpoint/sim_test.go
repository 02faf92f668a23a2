package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/storesim"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// The store protocol as a model, checked by deterministic simulation
// (issue 35 item 4; anchors: FoundationDB's simulation, TigerBeetle's
// VOPR). Each seed draws one small schedule: sessions of a run (lease,
// seal, restore, commits, retention) or the nodes of a job (part leases,
// restore of a part, part commits, retention), an outside hand that
// damages the newest checkpoint, faults on any operation (fails, reply
// lost, the process dies) and lists that lag. The actors run the real
// code against storesim's in-memory store, one operation at a time in an
// order drawn from the seed (storesim.Sched), and the checks below run at
// every operation (the whole-state ones after every operation that can
// change what restore answers: a manifest, latest.json, a deletion). A
// failure prints its seed and schedule; replay one with
// SPOTAGENT_SIM_SEED=<seed> go test ./pkg/checkpoint -run 'TestSim$' -v.
// SPOTAGENT_SIM_SCHEDULES and SPOTAGENT_SIM_FIRST choose the seeds,
// SPOTAGENT_SIM_MAXFAIL how many failures stop it (3), SPOTAGENT_SIM_BRIEF
// leaves the schedules out of the report.
//
// Determinism: the actors' code runs one at a time (storesim.Sched); the
// committers upload with Concurrency 1 and every checkpoint has one file
// per part, so no actor has two store calls in flight; awaitParts' back-off
// is a step of the schedule (partsSleep), not a wait; the store's clock
// is a counter. Wall-clock times the code records (Created, Updated) are
// ordered as the schedule orders them and decide nothing else.
//
// Fleet records (issue 40) are simulated over the same machinery by
// pkg/fleet's TestFleetSim.
//
// The properties (docs/reliability.md):
//   - restore (run's, sidecar's and node's with their epoch; restore's
//     without) picks the newest checkpoint whose manifest and objects are
//     complete, unless it is fenced (simFenced says exactly when), and
//     never a partial or mixed-step one;
//   - no write or delete touches an object of the checkpoint restore
//     would pick, or of a job checkpoint being assembled; a fenced
//     session never moves latest.json;
//   - latest.json never moves back in step within an epoch, nor back in
//     epoch.

// simRegressions are seeds that found bugs before they were fixed (each
// failed with the code of b5d8f13, the last before the fixes, and passes
// since 114fcc2).
var simRegressions = map[uint64]string{
	212:  "issue 35 bug 1: a commit whose latest.json write lost the race to a newer seal (manifest landed) was skipped as a fenced session's; the run started fresh",
	71:   "issue 35 bug 1, another schedule",
	2875: "issue 35 bug 2: after a rollback past a damaged newest checkpoint, one node's retention deleted the other node's parts of the job checkpoint being assembled",
	1:    "a pointer-less seal did not fence: restore resumed a fenced session's commit made after the newer session sealed",
	40:   "retention counted a fenced session's checkpoint toward --keep and a lagging listing hid the commit just made from it: the data of the checkpoint restore picks was deleted as an orphan",
}

// TestSimRegressions replays the seeds that found bugs.
func TestSimRegressions(t *testing.T) {
	for _, seed := range slices.Sorted(maps.Keys(simRegressions)) {
		if w := runSim(t, seed); w.failed() {
			t.Errorf("%s\n%s", simRegressions[seed], w.report())
		}
	}
}

// TestSimDeterministic: one seed, one schedule, step for step.
func TestSimDeterministic(t *testing.T) {
	for _, seed := range []uint64{212, 2875} {
		a, b := runSim(t, seed), runSim(t, seed)
		if !slices.Equal(a.sc.Trace, b.sc.Trace) {
			t.Errorf("seed %d: two runs differ:\n%s\n---\n%s", seed, strings.Join(a.sc.Trace, "\n"), strings.Join(b.sc.Trace, "\n"))
		}
		if len(a.sc.Trace) < 20 {
			t.Errorf("seed %d: %d steps, want a real schedule", seed, len(a.sc.Trace))
		}
	}
}

func TestSim(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	run := storesim.Seeds{Schedules: simDefault, Run: func(seed uint64) ([]string, string) { // SPOTAGENT_SIM_SCHEDULES: make soak-sim
		w := runSim(t, seed)
		if w.failed() {
			return w.sc.Trace, w.report()
		}
		return w.sc.Trace, ""
	}}.Test(t)
	if !run.Replay {
		t.Logf("%d schedules in %s: %.0f schedules/s", run.N, run.Took.Round(time.Millisecond), float64(run.N)/run.Took.Seconds())
	}
}

// simWorld is one schedule: the store, the scheduler, what the checks
// learned from the history so far, and what they found.
type simWorld struct {
	seed uint64
	st   *storesim.Store
	sc   *storesim.Sched
	dir  string // local scratch: checkpoint directories, restores
	job  bool   // the nodes of a job; else the sessions of one run
	keep int

	mu        sync.Mutex
	leaseTick map[int64]int64 // epoch: the tick its lease object landed
	sealTick  map[int64]int64 // epoch: the tick it first sealed latest.json
	latest    Latest          // latest.json as last written
	latestOK  bool
	assembly  map[*storesim.Actor]string // a node's job checkpoint (its prefix) while its commit runs
	epochOf   map[*storesim.Actor]int64  // a session's epoch, once taken
	pick      string                     // the manifest restore would pick now; "": none
	pickFiles map[string]bool            // and its object keys
	checked   int64                      // the store tick last checked
	manifests map[string]*Manifest       // parsed, by object version (nil: broken)
	restores  int
	bad       []string
}

func (w *simWorld) failed() bool { return len(w.bad) > 0 }

func (w *simWorld) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "simulation seed %d failed (replay: SPOTAGENT_SIM_SEED=%d go test ./pkg/checkpoint -run 'TestSim$' -v):\n", w.seed, w.seed)
	for _, v := range w.bad {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	if os.Getenv("SPOTAGENT_SIM_BRIEF") != "" {
		return b.String()
	}
	b.WriteString("schedule:\n")
	for _, l := range w.sc.Trace {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}

func (w *simWorld) violate(format string, args ...any) {
	if len(w.bad) < 5 {
		w.bad = append(w.bad, fmt.Sprintf("step %d: ", len(w.sc.Trace))+fmt.Sprintf(format, args...))
	}
}

var simOnce sync.Once

// simPolls is the context key of a part commit's budget of polls.
type simPolls struct{}

// runSim runs the schedule of one seed.
func runSim(t testing.TB, seed uint64) *simWorld {
	simOnce.Do(func() {
		base := partsSleep
		partsSleep = func(ctx context.Context, d time.Duration) error {
			if storesim.ActorOf(ctx) == nil {
				return base(ctx, d)
			}
			// A node waits for the others a bounded number of polls,
			// as its commit's deadline bounds it in an agent.
			if n, ok := ctx.Value(simPolls{}).(*int); ok {
				if *n--; *n < 0 {
					return context.DeadlineExceeded
				}
			}
			return storesim.Sleep(ctx, d)
		}
	})
	dir, err := os.MkdirTemp(simTmp(), "sim-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	w := &simWorld{seed: seed, st: storesim.New(), sc: storesim.NewSched(seed), dir: dir,
		leaseTick: map[int64]int64{}, sealTick: map[int64]int64{}, assembly: map[*storesim.Actor]string{},
		epochOf: map[*storesim.Actor]int64{}, checked: -1, manifests: map[string]*Manifest{}}
	r := w.sc.Rand()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.st.Clock = func() time.Time { clock = clock.Add(time.Second); return clock }
	w.st.Faults = w.sc
	w.sc.Check = w.onOp
	w.job = r.IntN(3) == 0
	w.keep = 1 + r.IntN(2)
	w.st.Lag = [...]int64{0, 0, 0, 1, 3}[r.IntN(5)]
	w.sc.FailRate = [...]float64{0, 0.02, 0.08}[r.IntN(3)]
	w.sc.LostRate = [...]float64{0, 0.03}[r.IntN(2)]
	w.sc.CrashRate = [...]float64{0, 0.01, 0.04}[r.IntN(3)]
	w.sc.MaxSteps = 400
	if w.job {
		w.runJob()
	} else {
		w.runSessions()
	}
	w.check()
	return w
}

var simTmpDir = sync.OnceValue(func() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "spotagent-sim-"); err == nil {
			return d
		}
	}
	d, _ := os.MkdirTemp("", "spotagent-sim-")
	return d
})

func simTmp() string { return simTmpDir() }

// runSessions: two or three sessions of one run, started at any point of
// each other's lives (a replacement machine while the old one still runs,
// or after it died), each taking its lease, restoring and committing.
func (w *simWorld) runSessions() {
	r := w.sc.Rand()
	n := 2 + r.IntN(2)
	for i := range n {
		name := fmt.Sprintf("s%d", i+1)
		commits, gaps := 1+r.IntN(3), []int64{1 + r.Int64N(5), 1 + r.Int64N(5), 1 + r.Int64N(5)}
		w.sc.Go(name, nil, func(ctx context.Context) { w.session(ctx, name, commits, gaps) })
	}
	if r.IntN(4) == 0 {
		w.sc.Go("damage", nil, w.damage)
	}
	if r.IntN(2) == 0 {
		w.sc.Go("restore", nil, func(ctx context.Context) { w.restore(ctx, "restore", RestoreOptions{}) })
	}
	if err := w.sc.Run(); err != nil {
		w.violate("%v", err)
	}
}

// session is one `spotagent run` (or sidecar) session.
func (w *simWorld) session(ctx context.Context, name string, commits int, gaps []int64) {
	a := storesim.ActorOf(ctx)
	l, err := AcquireLease(ctx, w.st, LeaseRecord{Session: name})
	if err != nil {
		return // fenced already, or the store failed: the agent exits
	}
	w.mu.Lock()
	w.epochOf[a] = l.Epoch
	w.mu.Unlock()
	m, ok := w.restore(ctx, name, RestoreOptions{MaxEpoch: l.Epoch})
	if !ok {
		return
	}
	step := int64(-1)
	if m != nil {
		step = m.Step
	}
	c := &Committer{Store: w.st, RunID: "sim", Concurrency: 1, Lease: l}
	for j := range commits {
		step += gaps[j]
		res, err := w.commit(ctx, c, name, fmt.Sprintf("%s-%d", name, j), step, nil)
		if errors.Is(err, ErrFenced) && j+1 < commits {
			// A fenced agent takes one last checkpoint, which it uploads
			// without publishing, and stops.
			w.commit(ctx, c, name, fmt.Sprintf("%s-last", name), step+1, nil)
			return
		}
		if err == nil {
			Prune(ctx, w.st, w.keep, nil, res.ManifestKey)
		}
	}
}

// commit writes one checkpoint directory and commits it: one small file
// whose content names the checkpoint (and part), so that restore's output
// shows what it mixed, if anything.
func (w *simWorld) commit(ctx context.Context, c *Committer, name, id string, step int64, part *PartSpec) (*Result, error) {
	d := filepath.Join(w.dir, name+"-"+id)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	node := ""
	if part != nil {
		node = part.Node
	}
	if err := os.WriteFile(filepath.Join(d, "model"+node+".bin"), simContent(step, id, node), 0o600); err != nil {
		return nil, err
	}
	return c.Commit(ctx, Request{Dir: d, ID: id, Step: step, Part: part})
}

func simContent(step int64, id, node string) []byte {
	return fmt.Appendf(nil, "step=%d id=%s node=%s", step, id, node)
}

// restore runs the real restore into a scratch directory and checks what
// it returns: complete, one step, not above the session's epoch.
func (w *simWorld) restore(ctx context.Context, name string, opts RestoreOptions) (*Manifest, bool) {
	opts.Stall = -1
	w.mu.Lock()
	w.restores++
	dest := filepath.Join(w.dir, fmt.Sprintf("restore-%s-%d", name, w.restores))
	w.mu.Unlock()
	r, err := Restore(ctx, w.st, dest, opts)
	if errors.Is(err, ErrNoCheckpoint) {
		return nil, true
	}
	if err != nil {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if opts.MaxEpoch > 0 && r.Manifest.Epoch > opts.MaxEpoch {
		w.violate("%s restored %s of epoch %d, above its own %d", name, r.Key, r.Manifest.Epoch, opts.MaxEpoch)
	}
	w.checkRestored(name, r)
	return r.Manifest, true
}

// checkRestored: every file restored names the checkpoint restored.
func (w *simWorld) checkRestored(who string, r *Restored) {
	w.checkContent(who, r, func(path string) ([]byte, error) {
		return os.ReadFile(filepath.Join(r.Dir, filepath.FromSlash(path)))
	})
}

// checkContent: every file of r, as read reads it, names r's checkpoint
// (and its part): nothing partial, nothing of another step.
func (w *simWorld) checkContent(who string, r *Restored, read func(path string) ([]byte, error)) {
	for _, f := range r.Manifest.Files {
		if opts := r.Parts; len(opts) == 1 && f.Part != opts[0] {
			continue
		}
		b, err := read(f.Path)
		if err != nil {
			w.violate("%s restored %s without %s: %v", who, r.Key, f.Path, err)
			continue
		}
		if want := simContent(r.Manifest.Step, r.Manifest.ID, f.Part); !bytes.Equal(b, want) {
			w.violate("%s restored %s: %s holds %q, want %q (mixed)", who, r.Key, f.Path, b, want)
		}
	}
}

// damage is an outside hand (a lifecycle rule, a person) that deletes one
// data object of the newest checkpoint: restore must fall back past it.
func (w *simWorld) damage(ctx context.Context) {
	var step int64 = -1
	var obj string
	w.st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		if s := stepOf(dirOf(o.Key)); s > step && strings.HasSuffix(o.Key, ".bin") {
			step, obj = s, o.Key
		}
		return nil
	})
	if obj != "" {
		w.st.Delete(ctx, obj)
	}
}

// runJob: two nodes of a job (one rank each), each a session that takes
// its part lease, restores its part and commits parts in step with the
// other; then the newest checkpoint may be damaged, and both nodes start
// again (a new session each) from what restore finds: a rollback.
func (w *simWorld) runJob() {
	r := w.sc.Rand()
	for phase := 1; phase <= 2; phase++ {
		commits := 1 + r.IntN(3)
		for k := range 2 {
			node := fmt.Sprintf("node-%d", k)
			name := fmt.Sprintf("p%d-%s", phase, node)
			w.sc.Go(name, nil, func(ctx context.Context) { w.nodeSession(ctx, name, node, k, phase, commits) })
		}
		if err := w.sc.Run(); err != nil {
			w.violate("%v", err)
			return
		}
		if phase == 1 && r.IntN(2) == 0 {
			w.sc.Go("damage", nil, w.damage)
			w.sc.Run()
		}
	}
}

// nodeSession is one node's agent of a job.
func (w *simWorld) nodeSession(ctx context.Context, name, node string, rank, phase, commits int) {
	a := storesim.ActorOf(ctx)
	l, err := AcquirePartLease(ctx, w.st, node, LeaseRecord{Session: name})
	if err != nil {
		return
	}
	m, ok := w.restore(ctx, name, RestoreOptions{Part: node})
	if !ok {
		return
	}
	step := int64(0)
	if m != nil {
		step = m.Step
	}
	c := &Committer{Store: w.st, RunID: "sim", Concurrency: 1, PartLease: l, Session: name}
	part := &PartSpec{Node: node, Ranks: []int{rank}, WorldSize: 2}
	for range commits {
		// Steps of ten, then one at a time after a restart: a rollback
		// past a damaged checkpoint assembles steps below it.
		step += [...]int64{0, 10, 1}[phase]
		id := fmt.Sprintf("p%dj%d", phase, step)
		w.mu.Lock()
		w.assembly[a] = Prefix(step, id)
		w.mu.Unlock()
		polls := 12
		cctx, cancel := context.WithCancel(context.WithValue(ctx, simPolls{}, &polls))
		res, err := w.commit(cctx, c, name, id, step, part)
		cancel()
		w.mu.Lock()
		delete(w.assembly, a)
		w.mu.Unlock()
		if err != nil {
			return // the agent gives the checkpoint up; so does the sim
		}
		Prune(ctx, w.st, w.keep, nil, res.ManifestKey)
	}
}

// onOp is storesim.Sched's Check: invariants of single operations, then
// (once an operation ran) the whole state.
func (w *simWorld) onOp(a *storesim.Actor, op storesim.Op, ran bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ran {
		w.beforeOp(a, op)
		return
	}
	if op.Kind == storesim.OpPut && err == nil {
		w.afterPut(a, op)
	}
	// What restore answers changes only with a manifest, latest.json or a
	// deletion (a data object is written before its manifest; leases and
	// part manifests are not read by restore).
	if op.Kind == storesim.OpDelete || op.Kind == storesim.OpPut && (op.Key == LatestKey || isManifestKey(op.Key)) {
		w.checkLocked()
	}
}

func (w *simWorld) beforeOp(a *storesim.Actor, op storesim.Op) {
	if op.Kind != storesim.OpPut && op.Kind != storesim.OpDelete {
		return
	}
	if a.Name == "damage" {
		return
	}
	if op.Opts.IfAbsent {
		return // cannot change what exists
	}
	if w.pickFiles[op.Key] || op.Key == w.pick {
		w.violate("%s: %s %s, an object of %s, the checkpoint restore picks", a.Name, op.Kind, op.Key, w.pick)
	}
	for other, prefix := range w.assembly {
		if other != a && !other.Dead() && strings.HasPrefix(op.Key, prefix) && op.Kind == storesim.OpDelete {
			w.violate("%s: delete %s, an object of %s, which %s is assembling", a.Name, op.Key, prefix, other.Name)
		}
	}
}

// afterPut records leases and seals, and checks latest.json's moves.
func (w *simWorld) afterPut(a *storesim.Actor, op storesim.Op) {
	tick := w.st.Tick()
	if rest, ok := strings.CutPrefix(op.Key, leaseDir); ok && !strings.Contains(rest, "/") {
		if e, err := strconv.ParseInt(strings.TrimSuffix(rest, ".json"), 10, 64); err == nil {
			w.leaseTick[e] = tick
		}
		return
	}
	if op.Key != LatestKey {
		return
	}
	var l Latest
	if json.Unmarshal(op.Body, &l) != nil {
		w.violate("%s wrote a latest.json that does not parse", a.Name)
		return
	}
	if w.latestOK {
		p := w.latest
		switch {
		case l.Epoch < p.Epoch:
			w.violate("%s moved latest.json back in epoch: %d to %d", a.Name, p.Epoch, l.Epoch)
		case l.Epoch == p.Epoch && p.Manifest != "" && (l.Manifest == "" || l.PointsAt() < p.PointsAt()):
			w.violate("%s moved latest.json back in step within epoch %d: %s to %s", a.Name, l.Epoch, p.Manifest, l.Manifest)
		}
	}
	if e, ok := w.epochOf[a]; ok && l.Epoch != e {
		w.violate("%s (epoch %d) wrote latest.json with epoch %d", a.Name, e, l.Epoch)
	}
	if _, ok := w.sealTick[l.Epoch]; !ok && (!w.latestOK || l.Epoch > w.latest.Epoch) {
		w.sealTick[l.Epoch] = tick
	}
	w.latest, w.latestOK = l, true
}

func (w *simWorld) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checkLocked()
}

// simCheckpoint is a manifest in the store, as the model sees it.
type simCheckpoint struct {
	key      string
	m        *Manifest
	created  int64
	complete bool   // every object there with its size and checksum
	fenced   string // why it is a fenced session's; "": it is not
	maybe    bool   // committed while a newer session was sealing: either
}

// simFenced is when a checkpoint counts as fenced: it was committed under
// an epoch below that of a session which had already sealed latest.json
// (its manifest landed after the seal). Committed before the newer session
// took its lease (by the lag of lists, when lists lag), it is a committed
// checkpoint like any other, whatever latest.json says. Committed between
// the two, it may count either way (the sealing session adopts what its
// listing, just before the seal, shows).
func (w *simWorld) simFenced(c *simCheckpoint) {
	for e, seal := range w.sealTick {
		if e <= c.m.Epoch {
			continue
		}
		if c.created > seal {
			c.fenced = fmt.Sprintf("committed at tick %d under epoch %d, after epoch %d sealed latest.json at tick %d", c.created, c.m.Epoch, e, seal)
			return
		}
		if take, ok := w.leaseTick[e]; !ok || c.created > take-w.st.Lag {
			c.maybe = true
		}
	}
}

// model reads the store as it is (no faults, no lag).
func (w *simWorld) model() (cks []*simCheckpoint, latest *Latest) {
	objs := map[string]storesim.Object{}
	for _, o := range w.st.Snapshot() {
		objs[o.Key] = o
	}
	if o, ok := objs[LatestKey]; ok {
		var l Latest
		if json.Unmarshal(o.Data, &l) == nil && l.Manifest != "" {
			latest = &l
		}
	}
	for k, o := range objs {
		if !strings.HasPrefix(k, prefixDir) || !strings.HasSuffix(k, "/"+manifestObj) {
			continue
		}
		m, ok := w.manifests[o.Version]
		if !ok {
			var err error
			if m, err = decodeManifest(bytes.NewReader(o.Data)); err != nil || m.Validate() != nil || ManifestKey(m.Step, m.ID) != k {
				m = nil
			}
			w.manifests[o.Version] = m // a version is never rewritten
		}
		if m == nil {
			continue
		}
		c := &simCheckpoint{key: k, m: m, created: o.Created, complete: true}
		for _, f := range m.Files {
			d, ok := objs[f.Key]
			if !ok || f.Verify(bytes.NewReader(d.Data)) != nil {
				c.complete = false
			}
		}
		w.simFenced(c)
		cks = append(cks, c)
	}
	slices.SortFunc(cks, func(a, b *simCheckpoint) int { return int(b.m.Step - a.m.Step) })
	return cks, latest
}

// checkLocked runs the real restore (without faults: an oracle's context)
// whenever the store changed, and holds its answer to the model: the
// newest complete checkpoint that is not fenced, or one of its step, or
// (when committed during a seal) a newer one.
func (w *simWorld) checkLocked() {
	tick := w.st.Tick()
	if tick == w.checked {
		return
	}
	w.checked = tick
	cks, latest := w.model()
	// `spotagent restore`'s view. A session's (MaxEpoch its own) is the
	// same while no manifest has a higher epoch than the newest lease's:
	// always, since a session commits only after its lease landed.
	for _, maxEpoch := range []int64{0} {
		want := int64(-1)
		for _, c := range cks {
			if c.complete && c.fenced == "" && !c.maybe && (maxEpoch == 0 || c.m.Epoch <= maxEpoch) {
				want = c.m.Step
				break
			}
		}
		// The real choice of restore (order, fencing, falling back past
		// damaged ones), its files fetched and verified in memory: the
		// sessions' own restores write to disk.
		got := map[string][]byte{}
		r, err := restoreWith(context.Background(), w.st, RestoreOptions{MaxEpoch: maxEpoch, Stall: -1}, "memory", func(ctx context.Context, st cloud.Store, key string, m, view *Manifest, _ *zap.Logger) (*Restored, error) {
			clear(got)
			for _, f := range view.Files {
				b, err := ReadSmall(ctx, st, f.Key, 1<<20)
				if err != nil {
					return nil, err
				}
				if err := f.Verify(bytes.NewReader(b)); err != nil {
					return nil, fmt.Errorf("%s: %w", f.Path, err)
				}
				got[f.Path] = b
			}
			return &Restored{Key: key, Manifest: m}, nil
		})
		who := fmt.Sprintf("restore (max epoch %d)", maxEpoch)
		if err != nil {
			if want >= 0 {
				w.violate("%s: %v; step %d is complete and not fenced", who, err, want)
			}
			continue
		}
		w.checkContent(who, r, func(path string) ([]byte, error) { return got[path], nil })
		var pick *simCheckpoint
		for _, c := range cks {
			if c.key == r.Key {
				pick = c
			}
		}
		switch {
		case pick == nil:
			w.violate("%s picked %s, which the model does not know", who, r.Key)
		case !pick.complete:
			w.violate("%s picked %s, which is not complete", who, r.Key)
		case pick.fenced != "" && (latest == nil || pick.m.Step > latest.PointsAt()):
			w.violate("%s picked %s, a fenced session's: %s", who, r.Key, pick.fenced)
		case pick.m.Step < want:
			w.violate("%s picked %s (step %d, epoch %d), but step %d is complete and not fenced (latest.json: %+v)", who, r.Key, pick.m.Step, pick.m.Epoch, want, latest)
		}
		if maxEpoch == 0 {
			w.pick = r.Key
			w.pickFiles = map[string]bool{}
			for _, f := range r.Manifest.Files {
				w.pickFiles[f.Key] = true
			}
		}
	}
}
