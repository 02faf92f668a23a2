package supervisor

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
// verdict the ranks' own RSTs give (agent_peers.go). The agent ends its
// ranks (their connections close, so the other nodes' ranks fail at once
// and their agents take the same path) and exits 75 after the crash
// records are read.
//
// A sidecar (no child) cannot signal the trainer container's processes: it
// creates peerLostFile beside its socket, in the directory the trainer
// container shares, and the trainer's script (deploy/kubernetes/
// multinode-job.yaml) ends torchrun and exits 75 when it appears.

// peerLostFile is the sidecar's word to the trainer container's script.
const peerLostFile = "peer-lost"

// heartbeats is the liveness monitor of a multi-node job's agents (nil
// until the first hello of a rank of such a job).
type heartbeats struct{ mon *liveness.Monitor }

// start starts the heartbeats at the first hello of a rank of a
// multi-node job (the hello says how many nodes) run by this agent's child
// or beside this sidecar; part is this node's part ("" not part mode).
func (h *heartbeats) start(m protocol.Message, cfg *Config, part, session string, life context.Context) {
	if h.mon != nil || cfg.Liveness.Timeout < 0 || part == "" || cfg.Watch != nil || m.Nodes == nil || *m.Nodes < 2 {
		return
	}
	k, err := ParseNodeRank(cfg.Node[len("node-"):])
	if err != nil || k >= *m.Nodes {
		cfg.Log.Error("no liveness heartbeats: this node's rank is not one of the job's nodes", zap.String("node", cfg.Node), zap.Int("nodes", *m.Nodes))
		return
	}
	c := cfg.Liveness
	c.Store, c.RunID, c.Node, c.Nodes, c.Session, c.Log = cfg.Store, cfg.RunID, k, *m.Nodes, session, cfg.Log
	mon, err := liveness.Start(life, c)
	if err != nil {
		cfg.Log.Error("no liveness heartbeats", zap.Error(err))
		return
	}
	h.mon = mon
}

// silent is where the silent neighbours arrive (nil: no heartbeats).
func (h *heartbeats) silent() <-chan liveness.Silence {
	if h.mon == nil {
		return nil
	}
	return h.mon.Silent()
}

// onPeerSilent: a neighbour's agent is silent. While the ranks train (no
// stop sequence, no verdict yet), that is a lost peer: end the ranks
// (endRanks: the loop stops the launcher).
func (w *rankWatch) onPeerSilent(s liveness.Silence, cfg *Config, running, stopping bool) (endRanks bool) {
	silent := time.Since(s.Since).Round(time.Millisecond)
	if len(cfg.Command) == 0 && !stopping {
		tellTrainerPeerLost(cfg, s, silent)
		return false
	}
	if !running || stopping || w.verdict != "" {
		cfg.Log.Info("a neighbour node's agent is silent; nothing to end here", zap.Int("peer_node", s.Node), zap.Duration("silent", silent))
		return false
	}
	w.verdict, w.verdictAt, w.ended = verdictPeerLost, time.Now(), true
	cfg.Metrics.Error("peer_silent")
	cfg.Log.Warn("a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks",
		zap.Int("peer_node", s.Node), zap.String("peer_session", s.Session), zap.Duration("silent", silent),
		zap.Duration("kill_after", cfg.KillAfter))
	return true
}

// stop tells the neighbours this agent leaves, and stops.
func (h *heartbeats) stop() {
	if h.mon != nil {
		h.mon.Close()
	}
}

// tellTrainerPeerLost creates peerLostFile beside the socket (a sidecar's
// trainer container shares that directory). Created exclusively and never
// through a symlink: one the trainer planted there is left alone.
func tellTrainerPeerLost(cfg *Config, s liveness.Silence, silent time.Duration) {
	p := filepath.Join(filepath.Dir(cfg.Server.Path), peerLostFile)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err == nil {
		_, err = f.WriteString("75\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		cfg.Log.Error("a neighbour node's agent is silent, but the trainer container cannot be told", zap.String("path", p), zap.Error(err))
		return
	}
	cfg.Metrics.Error("peer_silent")
	cfg.Log.Warn("a neighbour node's agent is silent (its machine stopped answering): told the trainer container to end its ranks",
		zap.Int("peer_node", s.Node), zap.String("peer_session", s.Session), zap.Duration("silent", silent), zap.String("path", p))
}
