package supervisor

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/ranks"
)

// Distributed jobs: several nodes, one agent each, one store. The agents
// never talk to each other. The job's ranks agree on one checkpoint (id,
// step, deadline) through a collective the Python client runs at poll;
// a rank whose agent did not ask for that checkpoint sends `join`, and its
// agent makes the same request locally. Each agent then commits its part
// (Config.Node): its ranks' files, which checkpoint.Commit joins with the
// other nodes' parts into one manifest once every rank's part is durable
// (pkg/checkpoint/parts.go, docs/distributed.md).

// cloudJob marks the stop an agent starts for a joined interruption: the
// notice reached another node of the job.
const cloudJob metadata.Cloud = "job"

// NodePart names the part of node rank k.
func NodePart(k int) string { return "node-" + strconv.Itoa(k) }

// ParseNodeRank reads a node rank (a flag or an environment variable).
func ParseNodeRank(s string) (int, error) {
	k, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || k < 0 || k > 1<<20 {
		return 0, fmt.Errorf("node rank %q: want a whole number >= 0", s)
	}
	return k, nil
}

// MultiNode reports whether a hello comes from one node of several.
func MultiNode(m protocol.Message) bool {
	return (m.Nodes != nil && *m.Nodes > 1) ||
		(m.WorldSize != nil && m.LocalWorldSize != nil && *m.WorldSize > *m.LocalWorldSize)
}

// noteRank records which rank answered r, for its part.
func (r *request) noteRank(c *protocol.Conn) {
	h, ok := c.Hello()
	if !ok || h.Rank == nil {
		return
	}
	if r.part.ranks == nil {
		r.part.ranks = map[int]bool{}
	}
	r.part.ranks[*h.Rank] = true
	if h.WorldSize != nil && *h.WorldSize > r.part.world {
		r.part.world = *h.WorldSize
	}
}

// onJoin: the job agreed on checkpoint m.ID, which another node's agent
// asked for (or a rank here whose request lost the agreement). Make the
// same request here; requests of this agent's own that lost are abandoned,
// and an interruption of its own hands its stop over to the joined one.
//
// Only a rank of a multi-rank job joins: the agreement that makes joins
// runs among several ranks. A join never gives this node's uploads
// priority (commit.Request.Urgent): only the machine's own notices do.
func (a *Agent) onJoin(c *protocol.Conn, m protocol.Message) {
	h, ok := c.Hello()
	if a.conns.Conn(c.ID()) == nil || !ok {
		a.conns.Reply(c, m.ID, "join: say hello first")
		return
	}
	if why := a.job.mayJoin(h); why != "" {
		a.conns.Reply(c, m.ID, why)
		return
	}
	if !localdirs.IsRequestID(m.ID) {
		a.conns.Reply(c, m.ID, "join: id must be 12 lowercase hex digits")
		return
	}
	if ranks, _, out := a.conns.JobRanks(); ranks[c.ID()] == nil {
		// pkg/supervisor/trainers: a join would make every request wait for it.
		a.conns.Reply(c, m.ID, "join: this connection is not one of the job's declared ranks ("+out[c.ID()]+")")
		return
	}
	if r, ok := a.commits.pending[m.ID]; ok {
		if !r.answeredBy[c.ID()] {
			r.waiting[c.ID()] = true
		}
		if err := c.Post(r.message()); err != nil {
			a.log.Warn("checkpoint request not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		}
		return
	}
	if _, ok := a.commits.uploads[m.ID]; ok {
		a.conns.Reply(c, m.ID, "join: checkpoint "+m.ID+" was already saved on this node")
		return
	}
	switch m.Reason {
	case protocol.ReasonPeriodic, protocol.ReasonManual, protocol.ReasonShutdown, protocol.ReasonInterruption:
	default:
		a.conns.Reply(c, m.ID, fmt.Sprintf("join: unknown reason %q", m.Reason))
		return
	}
	now := time.Now()
	urgent := m.Reason == protocol.ReasonInterruption || m.Reason == protocol.ReasonShutdown
	var deadline time.Time
	switch {
	case m.Deadline != nil && m.Deadline.After(now):
		deadline = *m.Deadline
	case m.Deadline == nil && urgent:
		// A rank's own SIGTERM (the kubelet's, torchrun's) offered to the
		// job has no deadline the agent gave: the grace of this node's own
		// shutdown bounds it, as if this agent had been signalled.
		deadline = a.cfg.RequestDeadline(a.commits.last.bytes, now.Add(a.cfg.TermGrace), now)
	default:
		a.conns.Reply(c, m.ID, "join: a deadline in the future is required")
		return
	}
	if deadline.After(now.Add(a.cfg.RequestTimeout)) {
		deadline = now.Add(a.cfg.RequestTimeout)
	}
	if s := a.stops.current; s != nil && (s.req == nil || a.commits.pending[s.req.id] != s.req) {
		// This node's interruption checkpoint is saved (or failed)
		// already: the job's ranks cannot be asked for another one.
		a.conns.Reply(c, m.ID, "join: this node is already stopping")
		return
	}
	var stop *stopState
	for id, r := range a.commits.pending {
		a.commits.dropped(id)
		if r.stop != nil {
			stop = r.stop
			r.stop = nil
		}
		a.log.Info("checkpoint request superseded by the job's", zap.String("id", id), zap.String("job_id", m.ID))
		a.dirs.removeDir(r, a.goBg, a.log)
	}
	if stop == nil && urgent {
		stop = a.stops.joined(m, deadline, now, a.commits.last.bytes)
	}
	r := a.requestID(m.ID, m.Reason, deadline, stop)
	if r == nil {
		if stop != nil {
			a.stops.failed(stop, "checkpoint request not delivered", now, a.stopEnds())
		}
		return
	}
	if stop != nil {
		a.stops.requested(stop, r, now)
	}
	a.log.Info("joined the job's checkpoint", zap.String("id", m.ID), zap.String("reason", m.Reason), zap.Time("deadline", deadline))
}

// message is r's checkpoint request as sent to a trainer.
func (r *request) message() protocol.Message {
	dl := r.deadline.UTC()
	return protocol.Message{Type: protocol.TypeCheckpoint, ID: r.id, Reason: r.reason, Dir: r.dir, Deadline: &dl}
}

// abandonPart: this node's part of r cannot be made (why): nothing is
// uploaded; the job checkpoint never completes and the previous one stands.
func (a *Agent) abandonPart(r *request, why string, now time.Time) {
	a.log.Warn("checkpoint abandoned", zap.String("id", r.id), zap.String("reason", r.reason), zap.String("why", why))
	a.cfg.Metrics.CommitFailed("trainer")
	a.dirs.removeDir(r, a.goBg, a.log)
	a.conns.Broadcast(protocol.Message{Type: protocol.TypeUploadFailed, ID: r.id, Error: why})
	a.sess.JournalAsync(func(j *journal.Journal) { j.Stats.Failures++ })
	if r.stop != nil {
		a.stops.failed(r.stop, why, now, a.stopEnds())
	}
}

// heartbeatEnv is what the job's heartbeats (ranks.Heartbeats) need of c.
func heartbeatEnv(c *Config) ranks.HeartbeatEnv {
	l := c.Liveness
	l.Store, l.RunID, l.Log = c.Store, c.RunID, c.Log
	rank := -1
	if k, err := ParseNodeRank(strings.TrimPrefix(c.Node, "node-")); err == nil && c.Node != "" {
		rank = k
	}
	return ranks.HeartbeatEnv{Liveness: l, Rank: rank, Watch: c.Watch != nil}
}
