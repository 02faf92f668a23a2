// Package jobrank plays the ranks of a multi-node job over the real
// protocol, as the Python client does: hello with the topology, join the
// request rank 0's node asked for, save, done, committed.
package jobrank

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spotagent/spotagent/pkg/protocol"
)

// Rank is one rank of a job, over the real protocol.
type Rank struct {
	N       int // its rank
	C       *protocol.Client
	Welcome protocol.Message // the agent's answer to its hello (resume: where it resumes)
	msgs    chan protocol.Message
}

// Dial connects rank of world (perNode ranks a node) to the agent at
// sock, retrying until the socket appears or ctx ends, and says hello with
// its topology; its messages are then read beside it (Next). A version 1
// hello: the welcome (Welcome) waits for the agent's restore and names
// the resumed checkpoint.
func Dial(ctx context.Context, sock string, rank, world, perNode int) (*Rank, error) {
	var c *protocol.Client
	for {
		var err error
		if c, err = protocol.Dial(ctx, sock); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rank %d: dial %s: %w", rank, sock, err)
		}
		time.Sleep(20 * time.Millisecond) // the socket appears once the agent is up; bounded by ctx
	}
	lr, node, nodes := rank%perNode, rank/perNode, world/perNode
	w, err := c.Hello(ctx, protocol.Message{PID: os.Getpid(), Rank: &rank, WorldSize: &world,
		Topology: protocol.Topology{LocalRank: &lr, LocalWorldSize: &perNode, NodeRank: &node, Nodes: &nodes}})
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	r := &Rank{N: rank, C: c, Welcome: w, msgs: make(chan protocol.Message, 64)}
	go func() {
		defer close(r.msgs)
		for {
			m, err := c.Recv(context.Background())
			if errors.Is(err, protocol.ErrBadMessage) {
				continue
			}
			if err != nil {
				return
			}
			r.msgs <- m
		}
	}()
	return r, nil
}

// Next returns the next message of type typ within timeout.
func (r *Rank) Next(typ string, timeout time.Duration) (protocol.Message, error) {
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-r.msgs:
			if !ok {
				return m, fmt.Errorf("rank %d: connection closed waiting for %s", r.N, typ)
			}
			if m.Type == typ {
				return m, nil
			}
		case <-deadline:
			return protocol.Message{}, fmt.Errorf("rank %d: no %s within %s", r.N, typ, timeout)
		}
	}
}

// SaveStep saves step: rank 0's node asks (its periodic schedule), every
// rank joins that request, saves its files (files(rank): name → bytes)
// and answers done; then every rank is told committed. Ranks below
// perNode are rank 0's node's.
func SaveStep(ctx context.Context, ranks []*Rank, step int64, perNode int, files func(int) map[string][]byte) error {
	req, err := ranks[0].Next(protocol.TypeCheckpoint, time.Minute)
	if err != nil {
		return err
	}
	dirs := map[int]string{0: req.Dir}
	for _, r := range ranks[1:] {
		if r.N < perNode { // rank 0's node: asked already, unless its hello came after the request
			if m, err := r.Next(protocol.TypeCheckpoint, 2*time.Second); err == nil {
				dirs[r.N] = m.Dir
				continue
			}
		}
		// As the Python client does: it learns the id from the agreement and joins.
		if err := r.C.Send(ctx, protocol.Message{Type: protocol.TypeJoin, ID: req.ID, Reason: req.Reason, Deadline: req.Deadline, Step: &step}); err != nil {
			return err
		}
		m, err := r.Next(protocol.TypeCheckpoint, time.Minute)
		if err != nil {
			return err
		}
		dirs[r.N] = m.Dir
	}
	for _, r := range ranks {
		for name, b := range files(r.N) {
			if err := os.WriteFile(filepath.Join(dirs[r.N], name), b, 0o600); err != nil {
				return err
			}
		}
	}
	for _, r := range ranks {
		if err := r.C.Send(ctx, protocol.Message{Type: protocol.TypeDone, ID: req.ID, Step: &step}); err != nil {
			return err
		}
	}
	for _, r := range ranks {
		if _, err := r.Next(protocol.TypeCommitted, 5*time.Minute); err != nil {
			return err
		}
	}
	return nil
}
