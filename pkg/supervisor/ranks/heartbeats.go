package ranks

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/protocol"
)

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
