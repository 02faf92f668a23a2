package supervisor

import (
	"os"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// noteAnswer records that c answered r, with its uid as it connected: the
// owner rule must hold for a trainer that has disconnected since (the
// commit starts once the last trainer answers).
func (r *request) noteAnswer(c *protocol.Conn) {
	r.answeredBy[c.ID()] = true
	if r.answerUIDs == nil {
		r.answerUIDs = map[uint64][]int{}
	}
	r.answerUIDs[c.ID()] = foreignUID(c)
}

// ownerUIDs are the uids every file of r must be owned by: those of the
// trainers that answered it, nil when one of them is the agent's own user
// (or its uid is unknown), whether or not it is still connected.
func (r *request) ownerUIDs() []int {
	var uids []int
	for cid := range r.answeredBy {
		uid := r.answerUIDs[cid]
		if uid == nil {
			return nil
		}
		uids = append(uids, uid...)
	}
	return uids
}

// foreignUID is c's peer uid when it is another user's than the agent's
// (the owner a file it reports saved must have: commit.Pipeline.Add);
// nil when it is the agent's own user, or unknown.
func foreignUID(c *protocol.Conn) []int {
	uid := c.PeerUID()
	if uid < 0 || uid == os.Geteuid() {
		return nil
	}
	return []int{uid}
}

// trainerOwned marks r's directory, as opened for its commit, as written
// by the trainers that answered r when they run as another user than the
// agent (node and sidecar modes with an agent running as root): every file
// uploaded from it must then be owned by one of them and have one link
// (checkpoint.OwnedBy), so that a trainer cannot make the agent read a
// file it could not read itself. A trainer of the agent's own user crosses
// no boundary: nothing is marked. The returned func lifts the mark.
func (r *request) trainerOwned() func() {
	if r.held == nil {
		return func() {}
	}
	return checkpoint.OwnedBy(r.held, r.ownerUIDs()...)
}
