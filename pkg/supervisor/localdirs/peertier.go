package localdirs

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// PeerTierConfig turns on the peer tier of a multi-node job's node
// (pkg/checkpoint/peertier, docs/distributed.md "Restore from a peer"):
// the agent serves its local tier's copies to the job's other agents and
// restores files from theirs before the store.
type PeerTierConfig struct {
	Enabled   bool
	Listen    string   // TCP address (":0": the kernel's choice)
	Advertise []string // hosts the other nodes reach this one at; empty: every address
	Stall     time.Duration
	// PeerWait bounds how long a restore waits, in all, for peers still
	// starting (peertier.Config.PeerWait): 0, the default; negative, none.
	PeerWait time.Duration
	// Replicas 1: keep a copy of another node's part too, a far one (--replicas).
	Replicas int
	// Shared: serve on this listener, not one of the run's own (node mode).
	Shared *peertier.Listener
	// Machine is this node's machine (the agent fills it from its
	// metadata): published in its record.
	Machine checkpoint.Machine
}

// peerStartTimeout bounds the store requests of the peer tier's start (the
// secret, the record): a slow store delays the start no longer than this.
const peerStartTimeout = 30 * time.Second

// OpenPeer starts the peer tier of node (of run runID in st, this
// session's) when c asks for it: nil when off, when this agent is no node
// of a job (node "") or when it cannot start (logged: restores then come
// from the local tier and the store). Watch mode opens none.
func (d *Dirs) OpenPeer(ctx context.Context, c PeerTierConfig, st cloud.Store, runID, node, session string, log *zap.Logger) {
	if !c.Enabled || node == "" {
		return
	}
	pc := peertier.Config{Store: st, RunID: runID, Node: node, Session: session,
		Listen: c.Listen, Advertise: c.Advertise, Stall: c.Stall, PeerWait: c.PeerWait, Replicas: c.Replicas, Machine: c.Machine, Shared: c.Shared, Log: log}
	if d.tier != nil {
		pc.Local = d.tier
	} else {
		log.Warn("peer tier: no local tier (--local-keep 0): this node serves its peers nothing, and only asks them")
	}
	ctx, cancel := context.WithTimeout(ctx, peerStartTimeout)
	defer cancel()
	n, err := peertier.Start(ctx, pc)
	if err != nil {
		log.Warn("peer tier off: restores come from this machine and the store", zap.Error(err))
		return
	}
	d.peer = n
}

// PublishPeer tells the other nodes what the local tier holds now (after
// it kept a copy of m); a failure costs them the store, nothing more.
// With --replicas, the part of m this node keeps is then copied in the
// background, except for a stop's checkpoint (replicate false): the agent
// is about to exit, and does not wait for it.
func (d *Dirs) PublishPeer(ctx context.Context, m *checkpoint.Manifest, replicate bool, log *zap.Logger) {
	if d.peer == nil {
		return
	}
	if err := d.peer.Publish(ctx); err != nil {
		log.Warn("peer tier: record not updated: the other nodes restore this copy from the store", zap.Error(err))
	}
	if replicate {
		d.peer.Replicate(m)
	}
}
