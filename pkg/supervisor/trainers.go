package supervisor

import "github.com/spotagent/spotagent/pkg/protocol"

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
	localWorld     int  // ranks on this node, as hellos said (part mode)
	warnedTopology bool // agent_job.go
}
