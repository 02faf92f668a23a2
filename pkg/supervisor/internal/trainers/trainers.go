// Package trainers holds the agent's trainers and their connections
// (Conns): hellos, byes, broadcast and error replies, whether they
// finished, and the rule of the job's declared ranks (declaredRanks):
// who a checkpoint request goes to and waits for.
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

// Conns is the trainers connected to this run: who said hello, who
// said bye, and what part mode learnt from their hellos. The loop tells
// it what happened (Welcomed, Bye, Disconnected, Answered) and asks it
// (Conn, Count, Finished, JobRanks).
type Conns struct {
	byID map[uint64]*protocol.Conn // trainers that said hello to this run
	had  bool                      // a trainer has come (EndWhenIdle)
	// saidBye: connections whose trainer said it finished; byes counts
	// them; leftUnfinished: one left without bye since the last start.
	saidBye        map[uint64]bool
	byes           int
	leftUnfinished bool
	// childGroup is the trainer's process group when the agent started it
	// (run mode; 0: none); fromChild the connections that came from it, as
	// they said hello: they go first in JobRanks.
	childGroup func() int
	fromChild  map[uint64]bool
	// leftOut: connections the rule left out (warned once each); they go
	// behind every other in JobRanks until they answer a checkpoint, so
	// that a silent one cannot take the place of a trainer that restarts.
	leftOut map[uint64]bool
	log     *zap.Logger
}

// New is a run with no trainer yet. childGroup is the process group of
// the trainer the agent started (nil or 0: none): its connections go first.
func New(log *zap.Logger, childGroup func() int) *Conns {
	return &Conns{byID: map[uint64]*protocol.Conn{}, saidBye: map[uint64]bool{}, childGroup: childGroup, log: log}
}

// Welcomed: c said hello and was welcomed; it counts as a trainer. It
// returns why the rule of the job's ranks leaves it out ("" it is one of
// the job's ranks; the caller logs which); any other connection its hello
// leaves out is warned of here (Review).
func (t *Conns) Welcomed(c *protocol.Conn) (leftOut string) {
	if len(t.byID) == 0 {
		t.leftUnfinished = false // a new start of the trainer(s)
	}
	t.byID[c.ID()] = c
	t.noteHello(c)
	t.had = true
	return t.review(c.ID())
}

// Bye: connection id's trainer said it finished its work.
func (t *Conns) Bye(id uint64) {
	if _, ok := t.byID[id]; ok {
		t.saidBye[id] = true
		t.byes++
	}
}

// SaidBye: connection id's trainer said it finished.
func (t *Conns) SaidBye(id uint64) bool { return t.saidBye[id] }

// Disconnected: connection id ended. A trainer that had not said bye left
// its work unfinished (Finished is false until the next start).
func (t *Conns) Disconnected(id uint64) {
	if _, ok := t.byID[id]; ok && !t.saidBye[id] {
		t.leftUnfinished = true
	}
	t.forget(id)
}

// Conn is the trainer connected as id (nil: none).
func (t *Conns) Conn(id uint64) *protocol.Conn { return t.byID[id] }

// Count is the trainers connected.
func (t *Conns) Count() int { return len(t.byID) }

// Had: a trainer has come to this run.
func (t *Conns) Had() bool { return t.had }

// Broadcast posts m to every connected trainer.
func (t *Conns) Broadcast(m protocol.Message) {
	for _, c := range t.byID {
		if err := c.Post(m); err != nil {
			t.log.Warn("message not delivered", zap.String("type", m.Type), zap.Uint64("conn", c.ID()), zap.Error(err))
		}
	}
}

// Reply posts an error reply to c's message id.
func (t *Conns) Reply(c *protocol.Conn, id, text string) {
	if err := c.Post(protocol.Message{Type: protocol.TypeError, ID: id, Error: text}); err != nil {
		t.log.Debug("error reply not delivered", zap.Error(err))
	}
}

// Finished reports whether the trainers came, said bye (finished
// their work) and left: none is connected, and every one that left since
// the last start said bye first.
func (t *Conns) Finished() bool {
	return t.had && len(t.byID) == 0 && !t.leftUnfinished && t.byes > 0
}

// Shape is the job as its first trainer's hello declared it.
type Shape struct {
	Ranked bool // the job's trainers say their rank (torchrun); false: one trainer
	World  int  // world_size (0: not said)
	Local  int  // local_world_size: ranks on this node (0: not said)
	Node   *int // node_rank
}

// helloConn is a connected trainer's hello, for JobRanks.
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
func declaredRanks(conns []helloConn) (ranks map[uint64]bool, shape Shape, out map[uint64]string) {
	ranks, out = map[uint64]bool{}, map[uint64]string{}
	if len(conns) == 0 {
		return ranks, shape, out
	}
	first := conns[0].hello
	shape = Shape{Ranked: first.Rank != nil, World: deref(first.WorldSize), Local: deref(first.LocalWorldSize), Node: first.NodeRank}
	held := map[int]bool{}
	for _, hc := range conns {
		h := hc.hello
		why := ""
		switch {
		case !shape.Ranked && len(ranks) > 0:
			why = "another trainer said hello first and no rank: a single-process job"
		case !shape.Ranked:
		case h.Rank == nil:
			why = "no rank, in a job whose trainers say theirs"
		case held[*h.Rank]:
			why = fmt.Sprintf("rank %d is held by an earlier connection", *h.Rank)
		case shape.World > 0 && *h.Rank >= shape.World:
			why = fmt.Sprintf("rank %d is beyond the job's world_size %d", *h.Rank, shape.World)
		case deref(h.WorldSize) != shape.World:
			why = fmt.Sprintf("world_size %d, the job declared %d", deref(h.WorldSize), shape.World)
		case h.NodeRank != nil && shape.Node != nil && *h.NodeRank != *shape.Node:
			why = fmt.Sprintf("node_rank %d, this node's ranks said %d", *h.NodeRank, *shape.Node)
		case shape.Local > 0 && len(ranks) >= shape.Local:
			why = fmt.Sprintf("this node's %d ranks (local_world_size) are all connected", shape.Local)
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

// JobRanks applies declaredRanks to the connected trainers: the ones a
// checkpoint request goes to and waits for, and the job's shape.
func (t *Conns) JobRanks() (map[uint64]*protocol.Conn, Shape, map[uint64]string) {
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
// agent's child (its process group), for JobRanks.
func (t *Conns) noteHello(c *protocol.Conn) {
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
func (t *Conns) forget(id uint64) {
	delete(t.saidBye, id)
	delete(t.byID, id)
	delete(t.leftOut, id)
	delete(t.fromChild, id)
}

// LocalWorld is the ranks on this node, as the job declared (part mode).
func (t *Conns) LocalWorld() int {
	_, shape, _ := t.JobRanks()
	return shape.Local
}

// LeftOutMsg is the warning, once per connection, that the rule left it out.
const LeftOutMsg = "connection is not one of the job's declared ranks: checkpoints never wait for it"

// review applies the rule after connection id's hello: why it is left
// out ("" it is one of the job's ranks; the caller logs which). A
// connection left out goes behind the others from then on; any other one
// the hello leaves out (the child's, going first) is warned of here.
func (t *Conns) review(id uint64) string {
	_, _, out := t.JobRanks()
	why := out[id]
	if why != "" {
		t.mark(id)
	}
	delete(out, id)
	t.WarnLeftOut(out)
	return why
}

func (t *Conns) mark(id uint64) {
	if t.leftOut == nil {
		t.leftOut = map[uint64]bool{}
	}
	t.leftOut[id] = true
}

// Answered: connection id answered a checkpoint request, as a trainer
// does: it no longer goes behind the others.
func (t *Conns) Answered(id uint64) { delete(t.leftOut, id) }

// WarnLeftOut logs, once per connection, that the rule left it out.
func (t *Conns) WarnLeftOut(out map[uint64]string) {
	for id, why := range out {
		if t.leftOut[id] {
			continue
		}
		t.mark(id)
		fields := []zap.Field{zap.Uint64("conn", id), zap.String("why", why)}
		if c := t.byID[id]; c != nil {
			fields = append(fields, zap.Int("peer_uid", c.PeerUID()), zap.Int("peer_pid", c.PeerPID()))
		}
		t.log.Warn(LeftOutMsg, fields...)
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
