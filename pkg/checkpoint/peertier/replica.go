package peertier

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// partAdder is a Local that can keep another node's part: localtier.Tier.
type partAdder interface {
	AddPart(ctx context.Context, m *checkpoint.Manifest, part string, open func(context.Context, checkpoint.File) (io.ReadCloser, error)) error
}

// replicaTries bounds the attempts of one replica copy: the kept part's
// node may not have kept its part yet when this one's commit lands.
const replicaTries = 5

// Replicate copies, in the background, the part of the committed
// checkpoint m that this node keeps (placement.go: a far one) into the
// local tier (Config.Replicas), from that node, then publishes the record. A newer call cancels an older copy in
// flight. A no-op without Replicas, a Local that can add parts, or a job
// checkpoint.
func (n *Node) Replicate(m *checkpoint.Manifest) {
	if n.cfg.Replicas < 1 || len(m.Parts) < 2 {
		return
	}
	if _, ok := n.cfg.Local.(partAdder); !ok {
		return
	}
	n.repMu.Lock()
	if n.repCancel != nil {
		n.repCancel()
	}
	ctx, cancel := context.WithCancel(n.life)
	n.repCancel = cancel
	n.repMu.Unlock()
	n.wg.Go(func() {
		defer cancel()
		wait := time.Second
		for try := 1; ; try++ {
			err := n.replicate(ctx, m)
			if err == nil || ctx.Err() != nil {
				return
			}
			if try == replicaTries {
				n.log.Warn("peer tier: no copy of the kept part: a replacement of its node reads that part from the store", zap.String("part", keptPart(m, n.cfg.Node)), zap.String("id", m.ID), zap.Error(err))
				return
			}
			n.log.Info("peer tier: the kept part is not copied yet (retrying)", zap.Duration("retry_in", wait), zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait *= 2
		}
	})
}

// replicate is one attempt of Replicate: every file of the part this node
// keeps, from the peers that hold it (that part's node first), verified.
func (n *Node) replicate(ctx context.Context, m *checkpoint.Manifest) error {
	part := keptPart(m, n.cfg.Node)
	if part == "" || part == n.cfg.Node {
		return nil
	}
	// A fresh client (the records may have changed since the last
	// attempt) that waits for no peer: the attempts are retried.
	cl := n.client()
	defer cl.hc.CloseIdleConnections()
	err := n.cfg.Local.(partAdder).AddPart(ctx, m, part, func(ctx context.Context, f checkpoint.File) (io.ReadCloser, error) {
		return cl.Open(ctx, m, f)
	})
	if err != nil {
		return fmt.Errorf("copy %s: %w", part, err)
	}
	return n.Publish(ctx)
}
