package agentsim

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// Part mode under the simulation: a job of two or three nodes, one agent
// each (supervisor.RunHosted with Config.Node, as `--node-rank` runs it),
// one or two ranks per node, all on one store. The ranks agree on each
// checkpoint as the Python client's collective does: a rank that gets a
// request the job has not seen offers it to every other rank, which
// sends its agent a `join` with the same id, reason, deadline and step.
// Every node hears the host's SIGTERMs; a notice reaches one node (its
// ranks carry the interruption to the others); one agent may be killed
// (its context ended: uploads cancelled at once) at a drawn moment,
// mid-commit or not. Checked besides the single-node properties (the
// same store checks, latest.json, the resumes of a later session): every
// manifest in the store is a job manifest naming every node's part with
// that node's ranks and files, and no two manifests share a step
// (checkJobStore); every rank of the job said done for each in time and
// its files are in it, with the bytes the rank saved for that checkpoint
// and step (checkEveryRank: not the agent's own account of its part's
// ranks), and a rank resumes only a checkpoint it saved whole;
// latest.json's checkpoint is complete at the end.

// jobShape is a seed's job: nodes, ranks per node (0 nodes: no job).
type jobShape struct{ nodes, local int }

// job is the ranks' agreement of one session.
type job struct {
	w     *world
	shape jobShape
	dp    bool // the ranks save data-parallel copies too (peers_test.go)
	mu    sync.Mutex
	ranks []*trainer
	steps map[string]int64 // request id → the step the job agreed on
	last  int64            // the newest step agreed on
}

// agree: rank t got request m; the job's step for it, and, for a request
// the job has not seen, a join sent by every other rank connected now.
func (j *job) agree(t *trainer, m protocol.Message, step int64) int64 {
	j.mu.Lock()
	if s, ok := j.steps[m.ID]; ok {
		j.mu.Unlock()
		return s
	}
	// The job's steps advance between two checkpoints it agrees on (two
	// requests within one second of training would share a step, as a
	// trainer that saves twice without a step between does: two
	// checkpoints of one state, which this check would count as two
	// manifests of one step; seed 9395).
	step = max(step, j.last+1)
	j.last = step
	j.steps[m.ID] = step
	others := slices.DeleteFunc(slices.Clone(j.ranks), func(o *trainer) bool { return o == t })
	j.mu.Unlock()
	for _, o := range others {
		s := step
		o.send(protocol.Message{Type: protocol.TypeJoin, ID: m.ID, Reason: m.Reason, Deadline: m.Deadline, Step: &s})
	}
	return step
}

// drawJob draws whether seed's sessions are a job (a quarter of the
// seeds), from a generator of its own.
func drawJob(seed uint64) jobShape {
	r := rand.New(rand.NewPCG(seed^0x10b, 1))
	if r.IntN(100) >= 25 {
		return jobShape{}
	}
	return jobShape{nodes: 2 + r.IntN(2), local: 1 + r.IntN(2)}
}

// rankFile is a file a rank wrote (rank<N>.bin, opt/rank<N>.bin);
// nodeOfPath its node (-1: none).
var rankFile = regexp.MustCompile(`rank([0-9]+)\.bin$`)

func (s jobShape) nodeOfPath(p string) int {
	r := rankOfPath(p)
	if r < 0 {
		return -1
	}
	return r / s.local
}

// runJobSession draws session k of a job and runs its agents to their end.
func (w *world) runJobSession(k int, grace, interval, reqTimeout time.Duration, keep int, f *faults, firstSig, secondSig, noticeAt, noticeFor time.Duration) {
	js := w.job
	r := rand.New(rand.NewPCG(w.seed^0x10b, uint64(k+1)))
	noticeNode := r.IntN(js.nodes)
	killNode, killAt := -1, time.Duration(-1)
	if r.IntN(100) < 30 {
		killNode, killAt = r.IntN(js.nodes), time.Duration(20+r.IntN(200))*time.Second
	}
	// A second copy of a node (a spot replacement while the old machine
	// runs): an agent of the same part, started later, without trainers;
	// its lease fences the first copy (fenceCopy).
	copyNode, copyAt := -1, time.Duration(-1)
	if r.IntN(100) < 30 {
		copyNode, copyAt = 1+r.IntN(js.nodes-1), time.Duration(20+r.IntN(200))*time.Second
	}
	fenceInterval := pick(r, 5*time.Second, 30*time.Second)
	jb := &job{w: w, shape: js, steps: map[string]int64{}, dp: drawDP(w.seed)}
	ps := drawPeerShape(w.seed, k, js.nodes) // peers_test.go
	if ps.quiet {
		f.fail, f.lost, f.slow = 0, 0, 0
	}
	shape := fmt.Sprintf("s%d: job nodes=%d ranks/node=%d grace=%s interval=%s request-timeout=%s keep=%d faults(fail=%.2f lost=%.2f slow=%.2f/%s) notice=%s/%s to node-%d signals=%s,%s kill=node-%d at %s second-copy=node-%d at %s fence-interval=%s",
		k, js.nodes, js.local, grace, interval, reqTimeout, keep, f.fail, f.lost, f.slow, f.slowFor, noticeAt, noticeFor, noticeNode, firstSig, secondSig, killNode, killAt, copyNode, copyAt, fenceInterval) + ps.String()
	w.mu.Lock()
	if w.shape != "" {
		w.shape += " | "
	}
	w.shape += shape
	w.mu.Unlock()
	newest := w.newestComplete()
	w.peerStart(ps, js, newest, f.fail == 0 && f.lost == 0 && f.slow == 0)
	start := time.Now()
	type node struct {
		sess    *session
		cancel  context.CancelFunc
		signals chan os.Signal
		notices chan metadata.Notice
		ended   time.Duration // -1: running
	}
	slots := js.nodes + 1            // the nodes, and a second copy of one
	nodes := make([]*node, slots)    // nil: not started
	endings := make(chan int, slots) // a node's agent returned
	var mu sync.Mutex                // loopAt
	loopAt := make([]time.Duration, slots)
	var trainers sync.WaitGroup
	for i := range loopAt {
		loopAt[i] = -1
	}
	// startAgent starts the agent of slot n, part p (n itself, or the
	// second copy's), with its ranks or none.
	startAgent := func(n, p int, withRanks bool) bool {
		name := fmt.Sprintf("node-%d", n)
		if n == js.nodes {
			name = fmt.Sprintf("node-%d-copy", p)
		}
		dir := filepath.Join(w.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			w.violate("node dir: %v", err)
			return false
		}
		root, err := os.OpenRoot(dir)
		if err != nil {
			w.violate("node dir: %v", err)
			return false
		}
		log := w.agentLog(k).With(zap.Int("node", n))
		srv := protocol.NewPipes(protocol.ServerConfig{Log: log})
		nd := &node{sess: &session{w: w, k: k, srv: srv, start: start, quit: make(chan struct{}), newest: newest},
			signals: make(chan os.Signal, 4), notices: make(chan metadata.Notice, 4), ended: -1}
		nodes[n] = nd
		cfg := supervisor.Config{RunID: "sim", CheckpointDir: dir, Store: w.st, Identity: metadata.Identity{Cloud: metadata.CloudAWS, InstanceID: fmt.Sprintf("i-%d-%s", k, name)}, FenceInterval: fenceInterval,
			Scheduler: schedule.NewScheduler(schedule.SchedulerConfig{Fixed: interval, Log: log}), Keep: keep, TermGrace: grace,
			RequestTimeout: reqTimeout, EndWhenIdle: true, Log: log, Node: supervisor.NodePart(p), Liveness: liveness.Config{Timeout: -1}}
		cfg.LocalKeep, cfg.PeerTier = w.peerConfig(ps, n)
		ctx, cancel := context.WithCancel(context.Background())
		nd.cancel = cancel
		asks := make(chan chan<- supervisor.Status, 1)
		reply := make(chan supervisor.Status, 1)
		asks <- reply
		stopped := make(chan struct{})
		go func() {
			err := supervisor.RunHosted(ctx, cfg, supervisor.Hosted{Dir: root, Events: srv.Events(), Notices: nd.notices, Signals: nd.signals, Asks: asks})
			if err != nil {
				w.logf("node-%d: agent refused to start: %v", n, err)
				f.mu.Lock()
				nf := f.injected
				f.mu.Unlock()
				if nf == 0 && ctx.Err() == nil { // not killed, nor lost (peers_test.go), while it started
					w.violate("node-%d: the agent refused to start without a store fault: %v", n, err)
				}
			}
			close(stopped)
			endings <- n
		}()
		go func() {
			select {
			case <-reply:
				mu.Lock()
				loopAt[n] = time.Since(start)
				mu.Unlock()
			case <-stopped:
			}
		}()
		for i := range js.local {
			if !withRanks {
				break
			}
			rank := n*js.local + i
			tr := &trainer{s: nd.sess, w: w, rank: rank, n: js.nodes * js.local, rng: rand.New(rand.NewPCG(w.seed, uint64(k*16+rank+8))),
				connectAt: time.Duration(r.IntN(20000)) * time.Millisecond, comebacks: r.IntN(2), job: jb, node: n}
			tr.modes = []mode{prompt, prompt, prompt, slow}
			for range r.IntN(2) {
				tr.modes = append(tr.modes, pick(r, late, never, crash, failing))
			}
			jb.ranks = append(jb.ranks, tr)
			w.logf("node-%d rank%d: at %s modes=%v comebacks=%d", n, rank, tr.connectAt, tr.modes, tr.comebacks)
			trainers.Go(tr.run)
		}
		return true
	}
	for n := range js.nodes {
		if !startAgent(n, n, true) {
			return
		}
	}
	// The host: signals to every node, the notice to one, the kill.
	type hostEv struct {
		at   time.Duration
		what string
	}
	evs := []hostEv{{firstSig, "signal"}}
	if secondSig >= 0 {
		evs = append(evs, hostEv{secondSig, "signal"})
	}
	if noticeAt >= 0 {
		evs = append(evs, hostEv{noticeAt, "notice"})
	}
	if killAt >= 0 {
		evs = append(evs, hostEv{killAt, "kill"})
	}
	if copyAt >= 0 {
		evs = append(evs, hostEv{copyAt, "copy"})
	}
	if ps.lostAt >= 0 {
		evs = append(evs, hostEv{ps.lostAt, "lost"})
	}
	slices.SortStableFunc(evs, func(a, b hostEv) int { return int(a.at - b.at) })
	fencedAt, fencedSlot := time.Duration(-1), -1 // when the newer copy's lease landed, and the older copy
	endOf := func(n int) {
		w.progOver() // progress_test.go: a node's end excuses the job's commits
		w.peerOver() // peers_test.go
		nd := nodes[n]
		nd.ended = time.Since(start)
		if n == js.nodes {
			w.logf("node-%d's second copy: agent ended", copyNode)
		} else {
			w.logf("node-%d: agent ended", n)
		}
		close(nd.sess.quit)
		nd.sess.srv.ClosePipes()
	}
	// Each node's bound: its first signal's (heard once its loop runs)
	// stop deadline and the exit's bound; a kill's exit bound.
	overdue := make([]bool, slots) // reported: its end is waited for, 10 minutes at most
	bound := func(n int) time.Duration {
		if overdue[n] {
			return copyAt + killAt + firstSig + 30*time.Minute
		}
		mu.Lock()
		at := loopAt[n]
		mu.Unlock()
		heard := max(firstSig, time.Since(start)) + 30*time.Minute
		if at >= 0 {
			heard = max(firstSig, at)
		}
		b := heard + grace + exitWait + 2*time.Second
		if secondSig >= 0 && at >= 0 && secondSig-max(firstSig, at) >= time.Second {
			b = min(b, secondSig+exitWait+2*time.Second)
		}
		if n == killNode {
			b = min(b, killAt+exitWait+2*time.Second)
		}
		if ps.lostAt >= 0 {
			b = min(b, ps.lostAt+exitWait+2*time.Second)
		}
		if n == fencedSlot && n < js.nodes && fencedAt >= 0 {
			// The first copy, with ranks (a fenced run that never had a
			// trainer, the second copy's, waits for its signal, as a
			// sidecar does).
			// Fenced at its next part write or lease check, which a slow
			// store may hold up to 30 s: its ranks stop at once (a job's
			// fenced copy takes no last checkpoint), then the exit's bound.
			// A periodic job commit of its in flight (its part written
			// before the fence, the other parts awaited) is cancelled at
			// the fence (seeds 4, 180 waited up to the commit's bound,
			// 10 minutes, before). A lease check that failed since the
			// fence cannot have seen the newer lease: the copy runs on
			// until one succeeds (seed 3979), given 10 minutes here.
			slack := time.Duration(0)
			w.mu.Lock()
			if w.leaseFailed.After(start.Add(fencedAt)) {
				slack = 10 * time.Minute
			}
			w.mu.Unlock()
			// Counted from its loop's start when that came after the
			// fence: a copy still starting (its store calls slow) checks
			// its lease only from then (seed 17691).
			from := max(fencedAt, at)
			if at < 0 {
				from = max(fencedAt, time.Since(start))
			}
			b = min(b, from+fenceInterval+30*time.Second+slack+exitWait+2*time.Second)
		}
		return b
	}
	next, live, signalled := 0, js.nodes, false
	fenceChecked := false
	// The fenced first copy stops its ranks at its next lease check
	// (--fence-interval; a slow store's 30 s; fenceCheckAt): none may
	// still be connected without a stop read since the fence.
	checkFenced := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, t := range jb.ranks {
			if t.node == fencedSlot && t.connected && t.stopAt.Before(start.Add(fencedAt)) {
				w.violateLocked("node-%d was fenced at %s: rank%d still connected at %s, never told to stop", fencedSlot, fencedAt, t.rank, time.Since(start))
			}
		}
	}
	for live > 0 {
		if copyNode >= 0 && fencedAt < 0 && nodes[js.nodes] != nil {
			if slot, at, ok := w.fenced(fmt.Sprintf("i-%d-node-%d", k, copyNode), fmt.Sprintf("i-%d-node-%d-copy", k, copyNode), copyNode, js.nodes); ok {
				fencedAt, fencedSlot = at.Sub(start), slot
				w.logf("store: node-%d's copies both hold a lease: the older epoch's (slot %d) is fenced from %s", copyNode, slot, fencedAt)
			}
		}
		wake := time.Duration(1<<62 - 1)
		if next < len(evs) {
			wake = evs[next].at
		}
		for n, nd := range nodes {
			if nd != nil && nd.ended < 0 {
				wake = min(wake, bound(n))
			}
		}
		if copyNode >= 0 && fencedAt < 0 && nodes[js.nodes] != nil {
			wake = min(wake, time.Since(start)+time.Second) // look for its lease
		}
		// Two lease checks, each of which a slow store may hold up 30 s
		// (the one under way when the newer lease landed may not see it:
		// seed 2506).
		fenceCheckAt := fencedAt + 2*(fenceInterval+30*time.Second) + 2*time.Second
		if fencedAt >= 0 && !fenceChecked && fencedSlot < js.nodes {
			wake = min(wake, fenceCheckAt)
		}
		t := time.NewTimer(time.Until(start.Add(wake)))
		select {
		case n := <-endings:
			endOf(n)
			live--
		case <-t.C:
		}
		t.Stop()
		now := time.Since(start)
		if fencedAt >= 0 && !fenceChecked && fencedSlot < js.nodes && now >= fenceCheckAt {
			fenceChecked = true
			// Only where no store operation fails: a lease check that
			// fails cannot see the newer lease (seed 3979).
			if nodes[fencedSlot].ended < 0 && f.fail == 0 {
				checkFenced()
			}
		}
		for next < len(evs) && evs[next].at <= now {
			ev := evs[next]
			next++
			w.progOver() // no progress owed once a stop, kill or copy came
			w.peerOver() // nor a peer's copy: a node ending may cut a transfer (peers_test.go)
			switch ev.what {
			case "signal":
				signalled = true
				w.logf("host: SIGTERM to every node")
				for _, nd := range nodes {
					if nd != nil && nd.ended < 0 {
						nd.signals <- syscall.SIGTERM
					}
				}
			case "notice":
				if nd := nodes[noticeNode]; nd.ended < 0 {
					w.logf("host: notice to node-%d, deadline in %s", noticeNode, noticeFor)
					nd.notices <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: fmt.Sprintf("notice-%d", k), Action: "terminate", Detected: time.Now(), Deadline: time.Now().Add(noticeFor)}
				}
			case "copy":
				if ps.lostAt >= 0 && ev.at >= ps.lostAt {
					break // the job's machines are lost: no copy starts
				}
				w.logf("host: a second copy of node-%d starts", copyNode)
				w.peerOver() // peers_test.go
				if startAgent(js.nodes, copyNode, false) {
					live++
					if signalled {
						nodes[js.nodes].signals <- syscall.SIGTERM // the host's stop reaches it too
					}
				}
			case "kill":
				if nd := nodes[killNode]; nd.ended < 0 {
					w.logf("host: node-%d's agent killed (its context ends)", killNode)
					nd.cancel()
				}
			case "lost": // peers_test.go
				w.logf("host: every machine of the job lost at once (each agent's context ends)")
				for _, nd := range nodes {
					if nd != nil && nd.ended < 0 {
						nd.cancel()
					}
				}
			}
		}
		for n, nd := range nodes {
			if nd != nil && nd.ended < 0 && now >= bound(n) {
				w.violate("node-%d: the agent did not end by %s after its start (signal at %s, grace %s)", n, bound(n), firstSig, grace)
				overdue[n] = true
				for _, nd := range nodes {
					if nd != nil {
						nd.cancel() // as a second signal: at once
					}
				}
				break
			}
		}
	}
	trainers.Wait()
	w.progEnd()
	w.mu.Lock()
	w.starts++
	w.ended = append(w.ended, time.Since(start).Round(time.Second).String())
	w.mu.Unlock()
	w.st.Faults = nil
	w.checkStore()
}

// checkJobStore: every manifest is a job manifest naming every node's
// part (its ranks, its files) and holding every rank's save
// (checkEveryRank), and no two share a step.
func (w *world) checkJobStore(ms []*checkpoint.Manifest) {
	js := w.job
	steps := map[int64]string{}
	for _, m := range ms {
		if other, ok := steps[m.Step]; ok && other != m.ID {
			w.violateLocked("two manifests of step %d: %s and %s", m.Step, other, m.ID)
		}
		steps[m.Step] = m.ID
		var nodes []string
		for _, p := range m.Parts {
			nodes = append(nodes, p.Node)
			var n int
			if _, err := fmt.Sscanf(p.Node, "node-%d", &n); err != nil {
				w.violateLocked("manifest %s (step %d): part %q is no node", m.ID, m.Step, p.Node)
				continue
			}
			var want []int
			for i := range js.local {
				want = append(want, n*js.local+i)
			}
			if !slices.Equal(p.Ranks, want) {
				w.violateLocked("manifest %s (step %d): part %s has ranks %v, want %v", m.ID, m.Step, p.Node, p.Ranks, want)
			}
		}
		slices.Sort(nodes)
		var want []string
		for n := range js.nodes {
			want = append(want, supervisor.NodePart(n))
		}
		if !slices.Equal(nodes, want) {
			w.violateLocked("manifest %s (step %d) names parts %v, want every node's %v", m.ID, m.Step, nodes, want)
		}
		sessions := map[string]map[string]bool{} // part → the session folders its files are in
		for _, f := range m.Files {
			if n := js.nodeOfPath(f.Path); f.Part != supervisor.NodePart(n) {
				w.violateLocked("manifest %s (step %d): %s is listed in part %q, written by node-%d", m.ID, m.Step, f.Path, f.Part, n)
			}
			// checkpoints/<step>-<id>/<node>/<session>/<path>
			// Below the part's folder of whichever checkpoint prefix holds
			// it: early uploads may sit under another step's (the newest
			// commit's, when the ranks report an older one; seed 67100).
			rest := strings.TrimPrefix(strings.TrimPrefix(f.Key, checkpoint.DirOf(f.Key)), f.Part+"/")
			sess, _, _ := strings.Cut(rest, "/")
			if sessions[f.Part] == nil {
				sessions[f.Part] = map[string]bool{}
			}
			sessions[f.Part][sess] = true
		}
		for part, ss := range sessions {
			if len(ss) > 1 {
				w.violateLocked("manifest %s (step %d): part %s mixes the files of %d copies of the node (sessions %v)", m.ID, m.Step, part, len(ss), slices.Sorted(maps.Keys(ss)))
			}
		}
		w.checkEveryRank(m)
	}
}

// checkEveryRank: a job checkpoint holds every rank's save of it, whole:
// every rank of the job said done in time, and the manifest holds each
// of its files with the bytes it wrote for this checkpoint and step (the
// first line of each names the request, the rank and the step). The
// agent's own account (a part's ranks) is not trusted for it: a part
// written before one of its node's ranks answered names that rank all
// the same.
func (w *world) checkEveryRank(m *checkpoint.Manifest) {
	inManifest := map[int][]string{}
	for _, f := range m.Files {
		if r := rankOfPath(f.Path); r >= 0 {
			inManifest[r] = append(inManifest[r], f.Path)
		}
	}
	for rank := range w.job.nodes * w.job.local {
		saved, ok := w.ranksOf[m.ID][rank]
		if !ok {
			w.violateLocked("manifest %s (step %d) is a job checkpoint, but rank%d never said done for it in time (it holds %v of rank%d)", m.ID, m.Step, rank, inManifest[rank], rank)
			continue
		}
		if got := slices.Sorted(slices.Values(inManifest[rank])); !slices.Equal(got, saved) {
			w.violateLocked("manifest %s (step %d) holds %v of rank%d, which saved %v", m.ID, m.Step, got, rank, saved)
		}
	}
	for _, f := range m.Files {
		rank := rankOfPath(f.Path)
		b, found := w.st.Peek(f.Key)
		if rank < 0 || !found {
			continue // a file no rank wrote, or an object retention deleted: checkStore's
		}
		head := fmt.Sprintf("%s rank %d step %d\n", m.ID, rank, m.Step)
		if strings.HasPrefix(f.Path, "dp/") { // the same on every rank (peers_test.go)
			head = fmt.Sprintf("%s weights step %d\n", m.ID, m.Step)
		}
		if !bytes.HasPrefix(b, []byte(head)) || int64(len(b)) != f.Size {
			w.violateLocked("manifest %s (step %d): %s (%d bytes, manifest says %d) is not rank%d's save of this checkpoint and step", m.ID, m.Step, f.Key, len(b), f.Size, rank)
		}
	}
}

// rankOfPath is the rank that wrote a file (rank<N>.bin, opt/rank<N>.bin);
// -1: none.
func rankOfPath(p string) int {
	m := rankFile.FindStringSubmatch(p)
	if m == nil {
		return -1
	}
	r, _ := strconv.Atoi(m[1])
	return r
}

// fenced: of the two copies of a node (instances first and second), the
// one whose lease has the lower epoch is fenced once the other's landed:
// which (the slot: the first copy's or the second's) and when; ok false
// until both leases landed.
func (w *world) fenced(first, second string, firstSlot, secondSlot int) (slot int, at time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var a, b *leaseWrite
	for i := range w.leases {
		switch l := &w.leases[i]; l.instance {
		case first:
			a = l
		case second:
			b = l
		}
	}
	if a == nil || b == nil {
		return 0, time.Time{}, false
	}
	if a.epoch < b.epoch {
		return firstSlot, b.at, true
	}
	return secondSlot, a.at, true
}

// leaseWrite is a lease object that landed in the store.
type leaseWrite struct {
	instance string // the agent's (LeaseRecord.Instance)
	epoch    int64
	at       time.Time
}
