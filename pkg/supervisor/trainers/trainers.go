package trainers

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
)

// trainerConns is the trainers connected to this run: who said hello, who
// said bye, and what part mode learnt from their hellos.
type trainerConns struct {
	byID map[uint64]*protocol.Conn // trainers that said hello to this run
	had  bool                      // a trainer has come (EndWhenIdle)
	// saidBye: connections whose trainer said it finished; byes counts
	// them; leftUnfinished: one left without bye since the last start.
	saidBye        map[uint64]bool
	byes           int
	leftUnfinished bool
	warnedTopology bool // agent_job.go
	// childGroup is the trainer's process group when the agent started it
	// (run mode; 0: none); fromChild the connections that came from it, as
	// they said hello: they go first in jobRanks.
	childGroup func() int
	fromChild  map[uint64]bool
	// leftOut: connections the rule left out (warned once each); they go
	// behind every other in jobRanks until they answer a checkpoint, so
	// that a silent one cannot take the place of a trainer that restarts.
	leftOut map[uint64]bool
	log     *zap.Logger
}

func (t *trainerConns) broadcast(m protocol.Message) {
	for _, c := range t.byID {
		if err := c.Post(m); err != nil {
			t.log.Warn("message not delivered", zap.String("type", m.Type), zap.Uint64("conn", c.ID()), zap.Error(err))
		}
	}
}

func (t *trainerConns) reply(c *protocol.Conn, id, text string) {
	if err := c.Post(protocol.Message{Type: protocol.TypeError, ID: id, Error: text}); err != nil {
		t.log.Debug("error reply not delivered", zap.Error(err))
	}
}

// finished reports whether the trainers came, said bye (finished
// their work) and left: none is connected, and every one that left since
// the last start said bye first.
func (t *trainerConns) finished() bool {
	return t.had && len(t.byID) == 0 && !t.leftUnfinished && t.byes > 0
}

// jobShape is the job as its first trainer's hello declared it.
type jobShape struct {
	ranked bool // the job's trainers say their rank (torchrun); false: one trainer
	world  int  // world_size (0: not said)
	local  int  // local_world_size: ranks on this node (0: not said)
	node   *int // node_rank
}

// helloConn is a connected trainer's hello, for jobRanks.
type helloConn struct {
	id    uint64
	hello protocol.Message
}

// declaredRanks is the rule of who a checkpoint request goes to and waits
// for (docs/protocol.md, "Who a checkpoint waits for"). conns are the
// connected trainers in order of precedence (the agent's child first,
// then the order they connected). The first declares the job's shape:
//
//   - no rank: a single-process trainer; it alone is the job.
//   - a rank: a job of world_size ranks, local_world_size of them on this
//     node. Each rank below world_size is held by the first connection
//     that says it with the same world_size and node_rank, up to
//     local_world_size ranks.
//
// Every other connection (no rank in a ranked job, a second trainer
// without rank, a duplicate rank, a rank beyond the declared world, a
// different world, more ranks than the node declared) is left out: it
// gets no checkpoint request and never holds one back. out says why.
func declaredRanks(conns []helloConn) (ranks map[uint64]bool, shape jobShape, out map[uint64]string) {
	ranks, out = map[uint64]bool{}, map[uint64]string{}
	if len(conns) == 0 {
		return ranks, shape, out
	}
	first := conns[0].hello
	shape = jobShape{ranked: first.Rank != nil, world: deref(first.WorldSize), local: deref(first.LocalWorldSize), node: first.NodeRank}
	held := map[int]bool{}
	for _, hc := range conns {
		h := hc.hello
		why := ""
		switch {
		case !shape.ranked && len(ranks) > 0:
			why = "another trainer said hello first and no rank: a single-process job"
		case !shape.ranked:
		case h.Rank == nil:
			why = "no rank, in a job whose trainers say theirs"
		case held[*h.Rank]:
			why = fmt.Sprintf("rank %d is held by an earlier connection", *h.Rank)
		case shape.world > 0 && *h.Rank >= shape.world:
			why = fmt.Sprintf("rank %d is beyond the job's world_size %d", *h.Rank, shape.world)
		case deref(h.WorldSize) != shape.world:
			why = fmt.Sprintf("world_size %d, the job declared %d", deref(h.WorldSize), shape.world)
		case h.NodeRank != nil && shape.node != nil && *h.NodeRank != *shape.node:
			why = fmt.Sprintf("node_rank %d, this node's ranks said %d", *h.NodeRank, *shape.node)
		case shape.local > 0 && len(ranks) >= shape.local:
			why = fmt.Sprintf("this node's %d ranks (local_world_size) are all connected", shape.local)
		}
		if why != "" {
			out[hc.id] = why
			continue
		}
		ranks[hc.id] = true
		if h.Rank != nil {
			held[*h.Rank] = true
		}
	}
	return ranks, shape, out
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// jobRanks applies declaredRanks to the connected trainers: the ones a
// checkpoint request goes to and waits for, and the job's shape.
func (t *trainerConns) jobRanks() (map[uint64]*protocol.Conn, jobShape, map[uint64]string) {
	key := func(c *protocol.Conn) int {
		switch {
		case t.fromChild[c.ID()]:
			return 0
		case !t.leftOut[c.ID()]:
			return 1
		}
		return 2
	}
	conns := slices.SortedFunc(maps.Values(t.byID), func(a, b *protocol.Conn) int {
		return cmp.Or(cmp.Compare(key(a), key(b)), cmp.Compare(a.ID(), b.ID()))
	})
	hs := make([]helloConn, 0, len(conns))
	for _, c := range conns {
		h, _ := c.Hello()
		hs = append(hs, helloConn{id: c.ID(), hello: h})
	}
	ids, shape, out := declaredRanks(hs)
	ranks := make(map[uint64]*protocol.Conn, len(ids))
	for id := range ids {
		ranks[id] = t.byID[id]
	}
	return ranks, shape, out
}

// noteHello records whether c, which just said hello, comes from the
// agent's child (its process group), for jobRanks.
func (t *trainerConns) noteHello(c *protocol.Conn) {
	if t.childGroup == nil {
		return
	}
	if g := t.childGroup(); g > 0 && inGroup(c.PeerPID(), g) {
		if t.fromChild == nil {
			t.fromChild = map[uint64]bool{}
		}
		t.fromChild[c.ID()] = true
	}
}

// forget drops what was noted of connection id, which ended.
func (t *trainerConns) forget(id uint64) {
	delete(t.saidBye, id)
	delete(t.byID, id)
	delete(t.leftOut, id)
	delete(t.fromChild, id)
}

// localWorld is the ranks on this node, as the job declared (part mode).
func (t *trainerConns) localWorld() int {
	_, shape, _ := t.jobRanks()
	return shape.local
}

// leftOutMsg is the warning, once per connection, that the rule left it out.
const leftOutMsg = "connection is not one of the job's declared ranks: checkpoints never wait for it"

// review applies the rule after connection id's hello: why it is left
// out ("" it is one of the job's ranks; the caller logs which). A
// connection left out goes behind the others from then on; any other one
// the hello leaves out (the child's, going first) is warned of here.
func (t *trainerConns) review(id uint64) string {
	_, _, out := t.jobRanks()
	why := out[id]
	if why != "" {
		t.mark(id)
	}
	delete(out, id)
	t.warnLeftOut(out)
	return why
}

func (t *trainerConns) mark(id uint64) {
	if t.leftOut == nil {
		t.leftOut = map[uint64]bool{}
	}
	t.leftOut[id] = true
}

// answered: connection id answered a checkpoint request, as a trainer
// does: it no longer goes behind the others.
func (t *trainerConns) answered(id uint64) { delete(t.leftOut, id) }

// warnLeftOut logs, once per connection, that the rule left it out.
func (t *trainerConns) warnLeftOut(out map[uint64]string) {
	for id, why := range out {
		if t.leftOut[id] {
			continue
		}
		t.mark(id)
		fields := []zap.Field{zap.Uint64("conn", id), zap.String("why", why)}
		if c := t.byID[id]; c != nil {
			fields = append(fields, zap.Int("peer_uid", c.PeerUID()), zap.Int("peer_pid", c.PeerPID()))
		}
		t.log.Warn(leftOutMsg, fields...)
	}
}

// inGroup reports whether process pid is in process group pgid, as
// /proc/<pid>/stat says (Linux; false elsewhere or when it has gone).
func inGroup(pid, pgid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return false
	}
	g, err := strconv.Atoi(f[2])
	return err == nil && g == pgid
}

// asking: this agent's schedule asks for periodic checkpoints, as
// job (the node hosting rank 0, in a job) decides from the declared ranks.
func (t *trainerConns) asking(job jobPolicy) bool {
	ranks, _, _ := t.jobRanks()
	return job.asksPeriodic(ranks)
}
