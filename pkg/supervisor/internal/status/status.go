// Package status is an agent's status as `spotagent status` prints it: a
// run's (Status, the reply to a status message), and a node agent's, of
// every run it serves (NodeStatus). pkg/supervisor names them too.
package status

import (
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

// Status is what `spotagent status` prints: the reply to a status message.
type Status struct {
	RunID          string            `json:"run_id"`
	Store          string            `json:"store"`
	Cloud          metadata.Cloud    `json:"cloud"`
	Instance       metadata.Identity `json:"instance"`
	Started        time.Time         `json:"started"`
	Child          *ChildStatus      `json:"child,omitempty"`
	Trainers       int               `json:"trainers"`
	LastCheckpoint *CheckpointStatus `json:"last_checkpoint,omitempty"`
	NextCheckpoint *time.Time        `json:"next_checkpoint,omitempty"`
	Interval       string            `json:"interval"`
	Uploading      int               `json:"uploading"`
	Pending        int               `json:"pending"`
	NoticesSeen    int               `json:"notices_seen"`
	LastNotice     *metadata.Notice  `json:"last_notice,omitempty"`
	Stopping       string            `json:"stopping,omitempty"` // reason, while an interruption runs
	Step           int64             `json:"step"`               // newest progress reported
	// NoticePromise: whether a notice checkpoint commits within each
	// cloud's notice, from the newest measurements (pkg/supervisor/promise).
	NoticePromise *promise.Status `json:"notice_promise,omitempty"`
}

// NodeStatus is a node agent's reply to a status message from a
// connection that named no run (spotagent status): every run it serves.
type NodeStatus struct {
	Node        bool            `json:"node"` // always true: tells this reply from a run's Status
	StorePrefix string          `json:"store_prefix"`
	Runs        []NodeRunStatus `json:"runs"` // by key
}

// NodeRunStatus is one run of a node agent.
type NodeRunStatus struct {
	// Key is the run id, and for one node of a multi-node job
	// "<run id>/node-<k>".
	Key string `json:"key"`
	// Status is the run's own, nil while it starts (its store opens, its
	// restore runs) or when its loop did not answer in time.
	Status *Status `json:"status,omitempty"`
}

// ChildStatus describes the trainer process.
type ChildStatus struct {
	PID      int  `json:"pid"`
	Running  bool `json:"running"`
	Restarts int  `json:"restarts"`
}

// CheckpointStatus describes the newest committed checkpoint.
type CheckpointStatus struct {
	ID    string    `json:"id"`
	Step  int64     `json:"step"`
	At    time.Time `json:"at"`
	Bytes int64     `json:"bytes"`
}
