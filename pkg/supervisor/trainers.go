package supervisor

import (
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
	localWorld     int  // ranks on this node, as hellos said (part mode)
	warnedTopology bool // agent_job.go
	log            *zap.Logger
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
