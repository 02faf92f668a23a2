package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/pkg/cloud"
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
// The agent watches its ranks (the processes that said hello as ranks of
// a multi-rank job): when the first of them leaves without bye and no stop
// sequence runs, the exit file as it was then is this node's verdict: 75,
// a lost peer; anything else (1, nothing: a rank killed by the OOM killer),
// a crash. Once every rank's process is gone it ends the launcher (SIGTERM
// to its group, SIGKILL after KillAfter), since nothing is left for it to
// do but wait for the vanished node, and exits 75 for a lost peer: the job
// restarts as a whole from its last committed checkpoint, not counted as a
// failure. A crash keeps the launcher's code.
//
// Across nodes: a crash on one node is a lost peer to the others. A node
// whose verdict is a crash writes crashes/<node>-<session>.json to the
// store at once; a node whose verdict is a lost peer looks for such a
// record of this incarnation of the job (written since this session
// started) peerCrashSettle after its own verdict, and finding one exits
// with the launcher's code instead of 75: a bug stays a counted failure
// on every node.

// peerCrashSettle is how long after its lost-peer verdict an agent waits
// before it looks for another node's crash record: that node's agent
// writes it as soon as its own first rank left, within milliseconds of
// the ranks here failing; the store write gets this long.
const peerCrashSettle = 3 * time.Second

// peerReconnectGrace: a rank whose connection ended without bye but whose
// process still runs this long after is reconnecting, not gone.
const peerReconnectGrace = 3 * time.Second

// crashDir holds the crash records of a job's nodes.
const crashDir = "crashes/"

const (
	verdictPeerLost = "peer_lost"
	verdictCrash    = "crash"
)

// rankWatch follows the ranks of the running child.
type rankWatch struct {
	env       rankEnv
	pids      map[int]bool   // ranks (pids) that said hello since the child started
	left      map[int]string // pid → the exit file when its connection ended without bye
	leftAt    map[int]time.Time
	order     []int  // pids in the order they left
	verdict   string // "", verdictPeerLost, verdictCrash
	verdictAt time.Time
	ended     bool // the launcher's group was sent SIGTERM
	// lookup, while not nil, brings the crash-record lookup's answer back
	// to the loop (crashLookup): the agent's exit code waits for it.
	lookup chan crashLookup
}

// rankEnv is what the ranks' watch needs of the agent: where crash
// records go (part mode only: records), this session, and the lifetime
// that owns the lookup beside the loop.
type rankEnv struct {
	part      bool // part mode: crashes are recorded and looked up; a launcher's 1 during a stop (agent_interrupted.go)
	store     cloud.Store
	node      string
	session   string
	started   time.Time
	killAfter time.Duration
	life      context.Context
	goBg      func(fn func(), fail func(error)) // Agent.goBgFail
	log       *zap.Logger
	metrics   Metrics
}

// crashLookup is the answer of the lookup for another node's crash record
// (peerCrashed), for the launcher's exit code.
type crashLookup struct {
	code int    // the launcher's exit code
	key  string // the record found, "" none
	err  error
}

// rankPoll is how often the loop looks at the processes of ranks that left.
const rankPoll = 100 * time.Millisecond

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
		return "", fmt.Errorf("list %s: %w", crashDir, ctx.Err())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	since = since.Add(-2 * time.Second) // clocks of store and machine differ a little
	var found string
	err := st.List(ctx, crashDir, func(o cloud.ObjectInfo) error {
		name := strings.TrimPrefix(o.Key, crashDir)
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
		return "", fmt.Errorf("list %s: %w", crashDir, err)
	}
	return found, nil
}

var errStopList = errors.New("found")

// reset forgets the ranks of an earlier start of the child.
func (w *rankWatch) reset() { *w = rankWatch{env: w.env} }

// hello notes a rank of a multi-rank job that said hello.
func (w *rankWatch) hello(m protocol.Message, running bool) {
	if m.PID <= 0 || m.WorldSize == nil || *m.WorldSize < 2 || !running {
		return
	}
	if w.pids == nil {
		w.pids = map[int]bool{}
	}
	w.pids[m.PID] = true
	delete(w.left, m.PID) // it reconnected
}

// pending reports whether tick waits for ranks' processes to end.
func (w *rankWatch) pending(running, stopping bool) bool {
	return running && !stopping && !w.ended && len(w.order) > 0
}

// peerLost reports whether the child's ranks ended because a peer of the
// job is gone (and no other node reported a crash of its own).
func (w *rankWatch) peerLost() bool { return w.verdict == verdictPeerLost }

// lookupDone is the pending crash-record lookup's answer (nil: none).
func (w *rankWatch) lookupDone() <-chan crashLookup { return w.lookup }

// recordCrash tells the job's other nodes that a rank here crashed on its
// own (they see it as a lost peer).
func (w *rankWatch) recordCrash(pid int) {
	if !w.env.part {
		return
	}
	rec := crashRecord{Node: w.env.node, Session: w.env.session, PID: pid, At: time.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	key := crashDir + w.env.node + "-" + w.env.session + ".json"
	st := w.env.store
	ctx := context.WithoutCancel(w.env.life) // lands even when the agent ends meanwhile
	w.env.goBg(func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := st.Put(ctx, key, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
			w.env.log.Warn("could not record the crash for the job's other nodes", zap.String("key", key), zap.Error(err))
			return
		}
		w.env.log.Info("crash recorded for the job's other nodes", zap.String("key", key))
	}, nil)
}

// lookForPeerCrash starts the lookup for another node's crash record
// beside the loop (owned by the agent's lifetime); its answer comes back
// as a loop event (onCrashLookup). Outside part mode there is no record
// to look for: the answer is at once "none".
func (w *rankWatch) lookForPeerCrash(code int) {
	done := make(chan crashLookup, 1)
	w.lookup = done
	if !w.env.part {
		done <- crashLookup{code: code}
		return
	}
	st, node, since, settle := w.env.store, w.env.node, w.env.started, w.verdictAt.Add(peerCrashSettle)
	w.env.goBg(func() {
		key, err := peerCrashed(w.env.life, st, node, since, settle)
		done <- crashLookup{code: code, key: key, err: err}
	}, func(err error) { done <- crashLookup{code: code, err: err} }) // a panic: the store cannot say
}

// peerLossExit is the agent's code for a child that exited with code
// (non-zero) after its ranks ended on a lost peer: ExitInterrupted, unless
// another node recorded a crash of its own (or the store cannot say). After
// a crash it is the launcher's code, 1 where the agent's SIGTERM ended it.
// After a lost peer the answer needs the store: the launcher's code stands
// until the lookup (lookForPeerCrash) comes back to the loop.
func (w *rankWatch) peerLossExit(code int) int {
	if w.ended && (code == 128+int(syscall.SIGTERM) || code == 128+int(syscall.SIGKILL)) {
		// The agent's own SIGTERM ended the launcher (torchrun answers it
		// with 1, or dies of it while it exits on its own): its ranks
		// failed, which torchrun reports as 1.
		code = 1
	}
	if !w.peerLost() || code == 0 {
		return code
	}
	w.lookForPeerCrash(code)
	return code
}

func (w *rankWatch) lookupExit(code int, key string, err error) int {
	switch {
	case err != nil:
		w.env.log.Error("ranks lost a peer, but the other nodes' crash records cannot be read: exiting with the launcher's code",
			zap.Int("code", code), zap.Error(err))
		return code
	case key != "":
		w.env.log.Warn("ranks lost a peer, which crashed on its own (its node recorded it): exiting with the launcher's code",
			zap.Int("code", code), zap.String("record", key))
		return code
	}
	w.env.metrics.Error("peer_lost")
	w.env.log.Warn("the ranks lost a peer of the job (a node vanished): exiting 75, the job restarts from its last committed checkpoint",
		zap.Int("launcher_code", code), zap.Duration("since_verdict", time.Since(w.verdictAt).Round(time.Millisecond)))
	return ExitInterrupted
}

// onLookup: the lookup for another node's crash record answered;
// it decides the exit code of a launcher whose ranks lost a peer.
func (w *rankWatch) onLookup(res crashLookup) int {
	w.lookup = nil
	return w.lookupExit(res.code, res.key, res.err)
}

// tick decides the verdict once the first rank that left is gone,
// and ends the launcher once every rank is.
func (w *rankWatch) tick(now time.Time, running, stopping bool) (endLauncher bool) {
	if !w.pending(running, stopping) {
		return false
	}
	for w.verdict == "" && len(w.order) > 0 {
		pid := w.order[0]
		if child.Alive(pid) {
			if now.Sub(w.leftAt[pid]) < peerReconnectGrace {
				return false
			}
			w.order = w.order[1:] // still running: it reconnects
			delete(w.left, pid)
			continue
		}
		w.verdict, w.verdictAt = verdictCrash, now
		if w.left[pid] == strconv.Itoa(ExitInterrupted) {
			w.verdict = verdictPeerLost
		}
		w.env.log.Warn("a rank of this node ended on an error", zap.Int("pid", pid), zap.String("verdict", w.verdict),
			zap.String("exit_file", w.left[pid]))
		if w.verdict == verdictCrash {
			w.recordCrash(pid)
		}
	}
	if w.verdict == "" {
		return false
	}
	for pid := range w.pids {
		if child.Alive(pid) {
			return false
		}
	}
	w.ended = true
	w.env.log.Warn("every rank of this node has exited: ending the launcher, which would wait for the other nodes",
		zap.String("verdict", w.verdict), zap.Duration("kill_after", w.env.killAfter))
	return true
}

// connEnded: a connection ended. A rank that leaves without bye while no
// stop sequence runs ended on an error: note what the exit file said then.
func (w *rankWatch) connEnded(c *protocol.Conn, saidBye, stopping, running bool, exitFile func() string) {
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
	w.left[h.PID] = exitFile()
	w.leftAt[h.PID] = time.Now()
	w.order = append(w.order, h.PID)
}
