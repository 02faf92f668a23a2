package supervisor

import (
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// commits is the checkpoints of this session: the requests the trainers
// were sent (agent_request.go), the uploads under way, their results, the
// newest committed checkpoint, and the trainer's pace between them.
type commits struct {
	committer *checkpoint.Committer
	pending   map[string]*request
	uploads   map[string]*upload
	results   chan commitResult
	last      committedCheckpoint
	lastBlock time.Time // when the trainer last finished saving (or started)
	blocked   float64   // seconds blocked in checkpoints this session (goodput)
	lastStep  int64
	interval  time.Duration
	promise   promiseState // the notice checkpoint's prediction (agent_promise.go)
}
