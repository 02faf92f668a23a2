package supervisor

import (
	"encoding/json"
	"time"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/status"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
)

// Status is what `spotagent status` prints (pkg/supervisor/internal/status).
type Status = status.Status

// The parts of a Status, and of a node agent's reply (pkg/supervisor/internal/status).
type (
	NodeStatus       = status.NodeStatus
	NodeRunStatus    = status.NodeRunStatus
	ChildStatus      = status.ChildStatus
	CheckpointStatus = status.CheckpointStatus
)

// status is the agent's Status now.
func (a *Agent) status() Status {
	now := time.Now()
	st := Status{
		RunID: a.cfg.RunID, Store: a.cfg.Store.URI(""), Cloud: a.cfg.Identity.Cloud, Instance: a.cfg.Identity,
		Started: a.sess.Started().UTC(), Trainers: a.trainers(), Interval: a.cfg.Scheduler.Interval().String(),
		Uploading: len(a.commits.uploads), Pending: len(a.commits.pending), NoticesSeen: a.stops.noticesSeen, LastNotice: a.stops.lastNotice,
		Step: a.commits.lastStep, NoticePromise: a.commits.promise.Status(),
	}
	if a.proc.Started() {
		st.Child = &ChildStatus{PID: a.proc.LastPID(), Running: a.proc.Running(), Restarts: a.proc.Restarts()}
	}
	if a.commits.last.id != "" {
		st.LastCheckpoint = &CheckpointStatus{ID: a.commits.last.id, Step: a.commits.last.step, At: a.commits.last.at, Bytes: a.commits.last.bytes}
	}
	if a.stops.current == nil {
		next := a.cfg.Scheduler.Next(a.commits.lastBlock, len(a.commits.uploads) > 0, now).UTC()
		st.NextCheckpoint = &next
	} else {
		st.Stopping = a.stops.current.reason
	}
	return st
}

func sendStatus(t *trainers.Conns, c *protocol.Conn, st Status) {
	b, err := json.Marshal(st)
	if err != nil {
		t.Reply(c, "", "status: "+err.Error())
		return
	}
	c.Post(protocol.Message{Type: protocol.TypeStatus, Status: b})
}
