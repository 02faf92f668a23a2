// Package ranks tracks the ranks of the agent's child in a multi-rank
// job (Tracker): a lost peer (a node vanished) ends the launcher and the agent
// exits 75; a crash of its own keeps its code and is recorded for the other
// nodes. Heartbeats (pkg/liveness) find a silent neighbour.
package ranks

// The ranks of the agent's child (Tracker: a lost peer, a crash of its
// own, a launcher's 1 during the job's stop) and the heartbeats between a
// multi-node job's agents (Heartbeats).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// A lost peer (#25): a node of a multi-node job vanishes without a notice
// (its machine, agent and ranks gone at once). The other nodes' ranks fail
// in their next collective; the Python client makes a rank whose
// collective failed because a peer is gone exit 75 and write 75 to the
// exit file, and a rank that crashed on its own write 1 there first (the
// file's first answer stands: the crashed rank writes before its sockets
// close, so before its local peers see it gone). torchrun then waits in its
// exit barrier for the vanished node (300 s in torch 1.13) and exits 1.
//
// The agent tracks its ranks (the processes that said hello as ranks of
// a multi-rank job): when the first of them leaves without bye and no stop
// sequence runs, the exit file as it was then is this node's verdict: 75,
// a lost peer; anything else (1, nothing: a rank killed by the OOM killer),
// a crash. Once every rank's process is gone it ends the launcher (SIGTERM
// to its group, SIGKILL after KillAfter), since nothing is left for it to
// do but wait for the vanished node, and exits 75 for a lost peer: the job
// restarts as a whole from its last committed checkpoint, not counted as a
// failure. A crash keeps the launcher's code. After a silent neighbour's
// verdict (Heartbeats, below) the agent has sent SIGTERM to the launcher's
// group already; once every rank's process is gone it SIGKILLs the
// launcher (Tick's KillLauncher) rather than wait for its own exit:
// torchrun has nothing left but to unwind and print a traceback, 1–2 s on a
// loaded machine, which was most of the time to the survivors' exit after
// the verdict (issue 51).
//
// Across nodes: a crash on one node is a lost peer to the others. A node
// whose verdict is a crash writes crashes/<node>-<session>.json to the
// store at once; a node whose verdict is a lost peer looks for such a
// record of this incarnation of the job (written since this session
// started) PeerCrashSettle after its own verdict, and finding one exits
// with the launcher's code instead of 75: a bug stays a counted failure
// on every node.

// PeerCrashSettle is how long after its lost-peer verdict an agent waits
// before it looks for another node's crash record: that node's agent
// writes it as soon as its own first rank left, within milliseconds of
// the ranks here failing; the store write gets this long.
const PeerCrashSettle = 3 * time.Second

// peerReconnectGrace: a rank whose connection ended without bye but whose
// process still runs this long after is reconnecting, not gone.
const peerReconnectGrace = 3 * time.Second

// CrashDir holds the crash records of a job's nodes.
const CrashDir = "crashes/"

const (
	verdictPeerLost = "peer_lost"
	verdictCrash    = "crash"
)

// Tracker follows the ranks of the running child: which said hello,
// which left without bye, and the verdict (a lost peer, a crash).
type Tracker struct {
	env       Env
	pids      map[int]bool   // ranks (pids) that said hello since the child started
	left      map[int]string // pid → the exit file when its connection ended without bye
	leftAt    map[int]time.Time
	order     []int         // pids in the order they left
	exitFile  func() string // reads what the ranks wrote to the exit file (ConnEnded's)
	verdict   string        // "", verdictPeerLost, verdictCrash
	verdictAt time.Time
	// silent: the verdict is a silent neighbour's (OnPeerSilent), whose
	// agent cannot be writing a crash record: the lookup does not wait.
	silent bool
	ended  bool // the launcher's group was sent SIGTERM
	// killed: after a silent neighbour's verdict, every rank was gone and
	// the launcher was SIGKILLed (Tick's KillLauncher).
	killed bool
	// lookup, while not nil, brings the crash-record lookup's answer back
	// to the loop (Lookup): the agent's exit code waits for it.
	lookup chan Lookup
}

// Env is what the ranks' tracker needs of the agent: where crash records
// go (part mode only: records), this session, the lifetime that owns the
// lookup beside the loop, and for a silent neighbour (Heartbeats, below)
// whether the agent is a sidecar (no child) and its socket's path.
type Env struct {
	Part       bool // part mode: crashes are recorded and looked up; a launcher's 1 during a stop (below)
	Store      cloud.Store
	Node       string
	Session    string
	Started    time.Time
	KillAfter  time.Duration
	Life       context.Context
	GoBg       func(fn func(), fail func(error)) // Agent.goBgFail
	Log        *zap.Logger
	Metrics    interface{ Error(component string) }
	Sidecar    bool
	SocketPath string
	// RunDir, in node mode, is the run's own directory (shared with the
	// trainer pod, unlike the node's socket directory): PeerLostFile goes
	// there.
	RunDir *os.Root
}

// Lookup is the answer of the lookup for another node's crash record
// (peerCrashed), for the launcher's exit code.
type Lookup struct {
	code int    // the launcher's exit code
	key  string // the record found, "" none
	err  error
}

// Poll is how often the loop looks at the processes of ranks that left.
const Poll = 100 * time.Millisecond

// crashRecord is crashes/<node>-<session>.json.
type crashRecord struct {
	Node    string    `json:"node"`
	Session string    `json:"session"`
	PID     int       `json:"pid"`
	At      time.Time `json:"at"`
}

// peerCrashed reports whether another node of the job recorded a crash of
// its own since this session started at since (a crash there is a lost
// peer here). It first waits until settle, or until ctx ends.
func peerCrashed(ctx context.Context, st cloud.Store, node string, since, settle time.Time) (string, error) {
	t := time.NewTimer(time.Until(settle))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return "", fmt.Errorf("list %s: %w", CrashDir, ctx.Err())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	since = since.Add(-2 * time.Second) // clocks of store and machine differ a little
	var found string
	err := st.List(ctx, CrashDir, func(o cloud.ObjectInfo) error {
		name := strings.TrimPrefix(o.Key, CrashDir)
		if strings.HasPrefix(name, node+"-") || o.Modified.Before(since) {
			return nil
		}
		found = o.Key
		return errStopList
	})
	if errors.Is(err, errStopList) {
		err = nil
	}
	if err != nil {
		return "", fmt.Errorf("list %s: %w", CrashDir, err)
	}
	return found, nil
}

var errStopList = errors.New("found")

// NewTracker is the ranks' tracker of an agent with env.
func NewTracker(env Env) Tracker { return Tracker{env: env} }

// Part reports part mode (Env.Part).
func (w *Tracker) Part() bool { return w.env.Part }

// Looking reports a crash-record lookup under way: the agent's exit code
// waits for it.
func (w *Tracker) Looking() bool { return w.lookup != nil }

// Reset forgets the ranks of an earlier start of the child.
func (w *Tracker) Reset() { *w = Tracker{env: w.env} }

// Hello notes a rank of a multi-rank job that said hello.
func (w *Tracker) Hello(m protocol.Message, running bool) {
	if m.PID <= 0 || m.WorldSize == nil || *m.WorldSize < 2 || !running {
		return
	}
	if w.pids == nil {
		w.pids = map[int]bool{}
	}
	w.pids[m.PID] = true
	delete(w.left, m.PID) // it reconnected
}

// Pending reports whether tick waits for ranks' processes to end: the
// first that left without bye (the verdict) and then all of them, or,
// after a silent neighbour's verdict, all of them before the launcher is
// SIGKILLed.
func (w *Tracker) Pending(running, stopping bool) bool {
	return running && !stopping && (!w.ended && len(w.order) > 0 || w.awaitingKill())
}

// awaitingKill: a silent neighbour's verdict sent the launcher's group
// SIGTERM (OnPeerSilent), and the launcher is not SIGKILLed yet. Without a
// rank known (none said hello) Stop's own SIGKILL after KillAfter stands.
func (w *Tracker) awaitingKill() bool {
	return w.silent && w.ended && !w.killed && len(w.pids) > 0
}

// PeerLost reports whether the child's ranks ended because a peer of the
// job is gone (and no other node reported a crash of its own).
func (w *Tracker) PeerLost() bool { return w.verdict == verdictPeerLost }

// LookupDone is the pending crash-record lookup's answer (nil: none).
func (w *Tracker) LookupDone() <-chan Lookup { return w.lookup }

// recordCrash tells the job's other nodes that a rank here crashed on its
// own (they see it as a lost peer).
func (w *Tracker) recordCrash(pid int) {
	if !w.env.Part {
		return
	}
	rec := crashRecord{Node: w.env.Node, Session: w.env.Session, PID: pid, At: time.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	key := CrashDir + w.env.Node + "-" + w.env.Session + ".json"
	st := w.env.Store
	ctx := context.WithoutCancel(w.env.Life) // lands even when the agent ends meanwhile
	w.env.GoBg(func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := st.Put(ctx, key, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
			w.env.Log.Warn("could not record the crash for the job's other nodes", zap.String("key", key), zap.Error(err))
			return
		}
		w.env.Log.Info("crash recorded for the job's other nodes", zap.String("key", key))
	}, nil)
}

// lookForPeerCrash starts the lookup for another node's crash record
// beside the loop (owned by the agent's lifetime); its answer comes back
// as a loop event (OnLookup). Outside part mode there is no record
// to look for: the answer is at once "none".
func (w *Tracker) lookForPeerCrash(code int) {
	done := make(chan Lookup, 1)
	w.lookup = done
	if !w.env.Part {
		done <- Lookup{code: code}
		return
	}
	st, node, since, settle := w.env.Store, w.env.Node, w.env.Started, w.settleAt()
	w.env.GoBg(func() {
		key, err := peerCrashed(w.env.Life, st, node, since, settle)
		done <- Lookup{code: code, key: key, err: err}
	}, func(err error) { done <- Lookup{code: code, err: err} }) // a panic: the store cannot say
}

// settleAt is when the crash-record lookup looks: PeerCrashSettle after
// the ranks' verdict, at once after a silent neighbour's. A node whose
// ranks crash has a live agent that records the crash and says it leaves
// (never silent), and another node's crash would have reached the ranks
// here as RSTs before any heartbeat timeout.
func (w *Tracker) settleAt() time.Time {
	if w.silent {
		return w.verdictAt
	}
	return w.verdictAt.Add(PeerCrashSettle)
}

// PeerLossExit is the agent's code for a child that exited with code
// (non-zero) after its ranks ended on a lost peer: protocol.ExitInterrupted, unless
// another node recorded a crash of its own (or the store cannot say). After
// a crash it is the launcher's code, 1 where the agent's SIGTERM ended it.
// After a lost peer the answer needs the store: the launcher's code stands
// until the lookup (lookForPeerCrash) comes back to the loop.
func (w *Tracker) PeerLossExit(code int) int {
	if w.ended && (code == 128+int(syscall.SIGTERM) || code == 128+int(syscall.SIGKILL)) {
		// The agent's own SIGTERM ended the launcher (torchrun answers it
		// with 1, or dies of it while it exits on its own): its ranks
		// failed, which torchrun reports as 1.
		code = 1
	}
	if !w.PeerLost() || code == 0 {
		return code
	}
	w.lookForPeerCrash(code)
	return code
}

func (w *Tracker) lookupExit(code int, key string, err error) int {
	switch {
	case err != nil:
		w.env.Log.Error("ranks lost a peer, but the other nodes' crash records cannot be read: exiting with the launcher's code",
			zap.Int("code", code), zap.Error(err))
		return code
	case key != "":
		w.env.Log.Warn("ranks lost a peer, which crashed on its own (its node recorded it): exiting with the launcher's code",
			zap.Int("code", code), zap.String("record", key))
		return code
	}
	w.env.Metrics.Error("peer_lost")
	w.env.Log.Warn("the ranks lost a peer of the job (a node vanished): exiting 75, the job restarts from its last committed checkpoint",
		zap.Int("launcher_code", code), zap.Duration("since_verdict", time.Since(w.verdictAt).Round(time.Millisecond)))
	return protocol.ExitInterrupted
}

// OnLookup: the lookup for another node's crash record answered;
// it decides the exit code of a launcher whose ranks lost a peer.
func (w *Tracker) OnLookup(res Lookup) int {
	w.lookup = nil
	return w.lookupExit(res.code, res.key, res.err)
}

// Action is what Tick asks of the loop.
type Action int

const (
	None Action = iota
	// EndLauncher: SIGTERM to the launcher's group, SIGKILL after
	// KillAfter (childproc.Process.Stop).
	EndLauncher
	// KillLauncher: SIGKILL to the launcher's group and what it started
	// outside it, now (childproc.Process.Kill); its group was sent SIGTERM
	// already.
	KillLauncher
)

// Tick decides the verdict once the first rank that left is gone, and
// ends the launcher once every rank is (EndLauncher). After a silent
// neighbour's verdict, whose launcher was sent SIGTERM with its ranks, it
// SIGKILLs the launcher once every rank is gone (KillLauncher). Neither
// during a stop sequence: a notice's or a signal's stop lets torchrun
// exit in order.
func (w *Tracker) Tick(now time.Time, running, stopping bool) Action {
	if !w.Pending(running, stopping) {
		return None
	}
	if w.awaitingKill() {
		return w.killOnceRanksGone(now)
	}
	for w.verdict == "" && len(w.order) > 0 {
		pid := w.order[0]
		if child.Alive(pid) {
			if now.Sub(w.leftAt[pid]) < peerReconnectGrace {
				return None
			}
			w.order = w.order[1:] // still running: it reconnects
			delete(w.left, pid)
			continue
		}
		w.verdict, w.verdictAt = verdictCrash, now
		said := w.left[pid]
		if said == "" && w.exitFile != nil {
			// The rank is gone now: what it wrote after its connection
			// closed (under load the close can come first) is final.
			said = w.exitFile()
		}
		if said == strconv.Itoa(protocol.ExitInterrupted) {
			w.verdict = verdictPeerLost
		}
		w.env.Log.Warn("a rank of this node ended on an error", zap.Int("pid", pid), zap.String("verdict", w.verdict),
			zap.String("exit_file", said))
		if w.verdict == verdictCrash {
			w.recordCrash(pid)
		}
	}
	if w.verdict == "" {
		return None
	}
	if !w.ranksGone() {
		return None
	}
	w.ended = true
	w.env.Log.Warn("every rank of this node has exited: ending the launcher, which would wait for the other nodes",
		zap.String("verdict", w.verdict), zap.Duration("kill_after", w.env.KillAfter))
	return EndLauncher
}

// ranksGone reports whether no rank's process runs any more.
func (w *Tracker) ranksGone() bool {
	for pid := range w.pids {
		if child.Alive(pid) {
			return false
		}
	}
	return true
}

// killOnceRanksGone: after a silent neighbour's verdict, KillLauncher once
// every rank's process is gone (the SIGTERM reached them), once.
func (w *Tracker) killOnceRanksGone(now time.Time) Action {
	if !w.ranksGone() {
		return None
	}
	w.killed = true
	w.env.Log.Warn("every rank of this node has exited after a silent neighbour's verdict: killing the launcher rather than wait for its own exit",
		zap.Duration("since_verdict", now.Sub(w.verdictAt).Round(time.Millisecond)))
	return KillLauncher
}

// ConnEnded: a connection ended. A rank that leaves without bye while no
// stop sequence runs ended on an error: note what the exit file said then.
func (w *Tracker) ConnEnded(c *protocol.Conn, saidBye, stopping, running bool, exitFile func() string) {
	h, ok := c.Hello()
	if !ok || !w.pids[h.PID] || saidBye || stopping || !running || w.verdict != "" {
		return
	}
	if w.left == nil {
		w.left, w.leftAt = map[int]string{}, map[int]time.Time{}
	}
	if _, seen := w.left[h.PID]; seen {
		return
	}
	w.left[h.PID], w.exitFile = exitFile(), exitFile
	w.leftAt[h.PID] = time.Now()
	w.order = append(w.order, h.PID)
}

// StopLauncherExit is the agent's code for a node of a multi-node job
// whose launcher exited 1 while the job's interruption or shutdown stop
// ran, and none of exitCodeFor's
// other cases applied (#37 item 4): the stop's checkpoint did not commit
// and no rank wrote 75 (ranks that lost a peer mid-stop and exited 1 on
// their own, as training scripts that catch exceptions do; a torchrun whose
// store host vanished). An interruption is never the job's bug: 75, unless
// a rank of this node crashed before the stop (a bug stays 1), and after a
// peer lost before the stop, whatever the other nodes' crash records say
// (peerLossExit).
func (w *Tracker) StopLauncherExit(code int) int {
	for pid, said := range w.left { // noted only while no stop ran: before it
		if said != strconv.Itoa(protocol.ExitInterrupted) {
			w.env.Log.Info("trainer exited 1 during the stop, after a rank of this node crashed before it: exiting 1",
				zap.Int("code", code), zap.Int("rank_pid", pid), zap.String("exit_file", said))
			return code
		}
	}
	if w.verdict == verdictPeerLost {
		return w.PeerLossExit(code) // tracker.go
	}
	w.env.Log.Info("trainer exited 1 during the job's stop and no rank crashed before it: exiting 75 (an interruption is not the job's bug)",
		zap.Int("code", code))
	return protocol.ExitInterrupted
}

// A silent peer (#37): a node of the job whose machine stops answering
// leaves no RST for the ranks here to see; they would wait out the process
// group's timeout (30 min for gloo). The agents of a multi-node job
// heartbeat their ring neighbours (pkg/liveness), beside the training
// loop: a neighbour silent for Config.Liveness.Timeout is a lost peer, the
// verdict the ranks' own RSTs give (tracker.go). The agent ends its
// ranks (their connections close, so the other nodes' ranks fail at once
// and their agents take the same path) and exits 75 after the crash
// records are read.
//
// A sidecar (no child) cannot signal the trainer container's processes: it
// creates PeerLostFile beside its socket, in the directory the trainer
// container shares, and the trainer's script (deploy/kubernetes/
// multinode-job.yaml) ends torchrun and exits 75 when it appears. A run
// of the node agent (pkg/supervisor/nodemode: no child either) creates it in
// the run's own directory instead (Env.RunDir), which the pod's script
// names in SPOTAGENT_PEER_LOST; its heartbeats share the node agent's one
// socket (liveness.Mux, set in Liveness by the node agent).

// PeerLostFile is the sidecar's word to the trainer container's script.
const PeerLostFile = "peer-lost"

// Heartbeats is the liveness monitor of a multi-node job's agents (nil
// until the first hello of a rank of such a job).
type Heartbeats struct{ mon *liveness.Monitor }

// HeartbeatEnv is what the heartbeats need of the agent's Config: its
// Liveness (with the store, run id and log set), this node's rank in the
// job (-1: none), and whether it runs in zero-code mode (no heartbeats).
type HeartbeatEnv struct {
	Liveness liveness.Config
	Rank     int
	Watch    bool
}

// Start starts the heartbeats at the first hello of a rank of a
// multi-node job (the hello says how many nodes) run by this agent's child
// or beside this sidecar; part is this node's part ("" not part mode).
func (h *Heartbeats) Start(m protocol.Message, env HeartbeatEnv, part, session string, life context.Context) {
	if h.mon != nil || env.Liveness.Timeout < 0 || part == "" || env.Watch || m.Nodes == nil || *m.Nodes < 2 {
		return
	}
	k, log := env.Rank, env.Liveness.Log
	if k < 0 || k >= *m.Nodes {
		log.Error("no liveness heartbeats: this node's rank is not one of the job's nodes", zap.String("node", part), zap.Int("nodes", *m.Nodes))
		return
	}
	c := env.Liveness
	c.Node, c.Nodes, c.Session = k, *m.Nodes, session
	mon, err := liveness.Start(life, c)
	if err != nil {
		log.Error("no liveness heartbeats", zap.Error(err))
		return
	}
	h.mon = mon
}

// Silent is where the silent neighbours arrive (nil: no heartbeats).
func (h *Heartbeats) Silent() <-chan liveness.Silence {
	if h.mon == nil {
		return nil
	}
	return h.mon.Silent()
}

// OnPeerSilent: a neighbour's agent is silent. While the ranks train (no
// stop sequence, no verdict yet), that is a lost peer: end the ranks
// (endRanks: the loop stops the launcher).
func (w *Tracker) OnPeerSilent(s liveness.Silence, running, stopping bool) (endRanks bool) {
	silent := time.Since(s.Since).Round(time.Millisecond)
	if w.env.Sidecar && !stopping {
		w.tellTrainerPeerLost(s, silent)
		return false
	}
	if !running || stopping || w.verdict != "" {
		w.env.Log.Info("a neighbour node's agent is silent; nothing to end here", zap.Int("peer_node", s.Node), zap.Duration("silent", silent))
		return false
	}
	w.verdict, w.verdictAt, w.ended, w.silent = verdictPeerLost, time.Now(), true, true
	w.env.Metrics.Error("peer_silent")
	w.env.Log.Warn("a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks",
		zap.Int("peer_node", s.Node), zap.String("peer_session", s.Session), zap.Duration("silent", silent),
		zap.Duration("kill_after", w.env.KillAfter))
	return true
}

// Stop tells the neighbours this agent leaves, and stops.
func (h *Heartbeats) Stop() {
	if h.mon != nil {
		h.mon.Close()
	}
}

// tellTrainerPeerLost creates PeerLostFile beside the socket (a sidecar's
// trainer container shares that directory), in node mode in the run's
// directory (Env.RunDir: the node's socket directory is every run's).
// Created exclusively and never through a symlink: one the trainer planted
// there is left alone.
func (w *Tracker) tellTrainerPeerLost(s liveness.Silence, silent time.Duration) {
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL | syscall.O_NOFOLLOW
	var (
		p   string
		f   *os.File
		err error
	)
	if w.env.RunDir != nil {
		p = filepath.Join(w.env.RunDir.Name(), PeerLostFile)
		f, err = w.env.RunDir.OpenFile(PeerLostFile, flags, 0o644)
	} else {
		p = filepath.Join(filepath.Dir(w.env.SocketPath), PeerLostFile)
		f, err = os.OpenFile(p, flags, 0o644)
	}
	if err == nil {
		_, err = f.WriteString("75\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		w.env.Log.Error("a neighbour node's agent is silent, but the trainer container cannot be told", zap.String("path", p), zap.Error(err))
		return
	}
	w.env.Metrics.Error("peer_silent")
	w.env.Log.Warn("a neighbour node's agent is silent (its machine stopped answering): told the trainer container to end its ranks",
		zap.Int("peer_node", s.Node), zap.String("peer_session", s.Session), zap.Duration("silent", silent), zap.String("path", p))
}
