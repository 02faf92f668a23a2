package supervisor

// Where single-node and part mode differ (jobPolicy: newJobPolicy is the
// one place that names singleNode and partNode), and part mode itself: one
// node of a multi-node job (node names, a rank's join, a node's part
// abandoned, the heartbeats' environment).

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/ranks"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
)

// jobPolicy is where single-node and part mode (one node of a multi-node
// job, job.go) differ: the loop asks it and never which mode runs.
// What a mode is, is values (the node this agent commits the part of, ""
// none); what it does differently, jobMode. newJobPolicy is the one place
// that names the two modes.
type jobPolicy struct {
	node       string // this agent's node of a job ("" single-node)
	restoreAll bool   // part mode: a restore fetches every node's part
	jobMode
}

// jobMode is what a mode does differently.
type jobMode interface {
	// takeLease takes the session's lease (the run's or the node's) into c.
	takeLease(ctx context.Context, st cloud.Store, rec checkpoint.LeaseRecord, c *commit.Committer) (*checkpoint.Lease, error)
	// pipeline starts the upload of a checkpoint the trainer is saving.
	pipeline(ctx context.Context, c *commit.Committer, held *os.Root, step int64, id string) *commit.Pipeline
	// partFor is r's part of a job checkpoint (nil: a whole one);
	// partMissing why r cannot be committed yet ("" it can), with
	// localWorld ranks on this node; lost why r, which lost trainers
	// before they saved, is abandoned ("" it is not).
	partFor(r *request) *checkpoint.PartSpec
	partMissing(r *request, localWorld int) string
	lost(r *request) string
	// asksPeriodic: this agent's schedule asks for periodic checkpoints.
	asksPeriodic(conns map[uint64]*protocol.Conn) bool
	// hello notes what a trainer's hello says of the job.
	hello(m protocol.Message, log *zap.Logger)
	// mayJoin: why a join is refused ("" allowed).
	mayJoin(h protocol.Message) string
}

func newJobPolicy(cfg *Config) jobPolicy {
	if cfg.Node == "" {
		return jobPolicy{jobMode: &singleNode{}}
	}
	return jobPolicy{node: cfg.Node, restoreAll: cfg.RestoreAll, jobMode: partNode{node: cfg.Node}}
}

// part is the part this agent commits ("" a whole checkpoint).
func (j jobPolicy) part() string { return j.node }

// restorePart is the part a restore fetches ("" every one).
func (j jobPolicy) restorePart() string {
	if j.restoreAll {
		return ""
	}
	return j.node
}

// cleanup is what the store's cleanup may delete of uploads in flight:
// in a job, other nodes' uploads in flight are theirs: only this node's
// part, or what is older than a day.
func (j jobPolicy) cleanup() []cloud.CleanupOptions {
	if j.node == "" {
		return nil
	}
	return []cloud.CleanupOptions{checkpoint.PartCleanup(j.node)}
}

// committer sets up the session's committer (session: its id): in a job,
// part data of this session only (pkg/checkpoint, manifest.go).
func (j jobPolicy) committer(c *commit.Committer, session string) {
	if j.node != "" {
		c.SessionParts(session)
	}
}

// ownCheckpoint: why a checkpoint a trainer took on its own is refused
// ("" it is committed). One node's own checkpoint is no job checkpoint:
// as a part of one it would stand for the whole job (docs/distributed.md).
func (j jobPolicy) ownCheckpoint() string {
	if j.node == "" {
		return ""
	}
	return "done: in a multi-node job every rank saves together, when its agent asks (the job's agreement): a checkpoint taken on one rank's own cannot be committed"
}

// ranksAgree: the ranks agree on each request's reason and deadline,
// and are told when they change; crashRecords: a crash here is recorded
// for the job's other nodes, and theirs looked for; fencedStopsAtOnce: a
// fenced copy takes no last checkpoint. All three hold in a job.
func (j jobPolicy) ranksAgree() bool        { return j.node != "" }
func (j jobPolicy) crashRecords() bool      { return j.node != "" }
func (j jobPolicy) fencedStopsAtOnce() bool { return j.node != "" }

// singleNode: the agent commits whole checkpoints of the run.
type singleNode struct {
	warnedTopology bool // hello: warned once that a trainer is one node of a job
}

func (singleNode) partFor(*request) *checkpoint.PartSpec       { return nil }
func (singleNode) partMissing(*request, int) string            { return "" }
func (singleNode) lost(*request) string                        { return "" }
func (singleNode) asksPeriodic(map[uint64]*protocol.Conn) bool { return true }

func (singleNode) takeLease(ctx context.Context, st cloud.Store, rec checkpoint.LeaseRecord, c *commit.Committer) (*checkpoint.Lease, error) {
	l, err := checkpoint.AcquireLease(ctx, st, rec)
	if err != nil {
		return nil, fmt.Errorf("take lease: %w", err)
	}
	c.Fence(l)
	return l, nil
}

func (singleNode) pipeline(ctx context.Context, c *commit.Committer, held *os.Root, step int64, id string) *commit.Pipeline {
	return c.NewPipeline(ctx, held, step, id)
}

// hello warns when a trainer's hello says it is one node of a job and
// this agent was not told its node rank: its commits would then be whole
// checkpoints made of one node's files.
func (s *singleNode) hello(m protocol.Message, log *zap.Logger) {
	if s.warnedTopology || !MultiNode(m) {
		return
	}
	s.warnedTopology = true
	log.Error("trainer is one node of a multi-node job but this agent has no --node-rank: each node would commit only its own ranks' files; run every node's agent with --node-rank",
		zap.Intp("nodes", m.Nodes), zap.Intp("world_size", m.WorldSize), zap.Intp("local_world_size", m.LocalWorldSize))
}

// mayJoin: only a rank of a multi-rank job joins: the agreement that
// makes joins runs among several ranks.
func (singleNode) mayJoin(h protocol.Message) string {
	if h.WorldSize == nil || *h.WorldSize < 2 {
		return "join: only a rank of a multi-rank job joins a checkpoint (this trainer said no world_size > 1)"
	}
	return ""
}

// partNode: the agent is one node of a multi-node job and commits its
// ranks' files as its part of each job checkpoint (job.go).
type partNode struct {
	node string
}

func (p partNode) takeLease(ctx context.Context, st cloud.Store, rec checkpoint.LeaseRecord, c *commit.Committer) (*checkpoint.Lease, error) {
	l, err := checkpoint.AcquirePartLease(ctx, st, p.node, rec)
	if err != nil {
		return nil, fmt.Errorf("take lease of %s: %w", p.node, err)
	}
	c.FenceParts(l)
	return l, nil
}

func (p partNode) pipeline(ctx context.Context, c *commit.Committer, held *os.Root, step int64, id string) *commit.Pipeline {
	return c.NewPartPipeline(ctx, held, step, id, p.node)
}

// partFor: settle has made sure that r's ranks are known (partMissing).
func (p partNode) partFor(r *request) *checkpoint.PartSpec {
	ranks := slices.Sorted(maps.Keys(r.part.ranks))
	return &checkpoint.PartSpec{Node: p.node, Ranks: ranks, WorldSize: max(r.part.world, 1)}
}

// partMissing: a rank that hello said exists on this node has not
// answered (it may connect and join a few ms late), or no trainer said
// which rank it is.
func (partNode) partMissing(r *request, localWorld int) string {
	if len(r.part.ranks) == 0 {
		return "no trainer of this node said its rank: a part of a job checkpoint needs rank and world_size in hello"
	}
	if len(r.part.ranks) < localWorld {
		return fmt.Sprintf("%d of this node's %d ranks saved it", len(r.part.ranks), localWorld)
	}
	return ""
}

func (partNode) lost(r *request) string {
	if r.lost == 0 {
		return ""
	}
	return fmt.Sprintf("%d trainer(s) of this node disconnected before saving: job checkpoint abandoned", r.lost)
}

// asksPeriodic: in a job, only the node hosting rank 0 asks (the others'
// ranks join its requests), so that the job has one schedule.
func (partNode) asksPeriodic(conns map[uint64]*protocol.Conn) bool {
	for _, c := range conns {
		if h, ok := c.Hello(); ok && h.Rank != nil && *h.Rank == 0 {
			return true
		}
	}
	return false
}

// hello: how many ranks run on this node is the job's declared shape
// (pkg/supervisor/internal/trainers, JobRanks): a part waits for all of them, even one that
// connects after the request was sent, and never for more.
func (partNode) hello(protocol.Message, *zap.Logger) {}

func (partNode) mayJoin(protocol.Message) string { return "" }

// asking: this agent's schedule asks for periodic checkpoints, as
// job (the node hosting rank 0, in a job) decides from the declared ranks.
func asking(t *trainers.Conns, job jobPolicy) bool {
	ranks, _, _ := t.JobRanks()
	return job.asksPeriodic(ranks)
}

// Distributed jobs: several nodes, one agent each, one store. The agents
// never talk to each other. The job's ranks agree on one checkpoint (id,
// step, deadline) through a collective the Python client runs at poll;
// a rank whose agent did not ask for that checkpoint sends `join`, and its
// agent makes the same request locally. Each agent then commits its part
// (Config.Node): its ranks' files, which checkpoint.Commit joins with the
// other nodes' parts into one manifest once every rank's part is durable
// (pkg/checkpoint/manifest.go, docs/distributed.md).

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
		// pkg/supervisor/internal/trainers: a join would make every request wait for it.
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
