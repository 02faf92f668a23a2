// Package metadata turns the clouds' interruption signals into one Notice
// type. One subpackage per cloud (aws, gcp, azure) implements Source.
package metadata

import (
	"context"
	"time"
)

// Cloud names where a notice came from.
type Cloud string

const (
	CloudAWS    Cloud = "aws"
	CloudGCP    Cloud = "gcp"
	CloudAzure  Cloud = "azure"
	CloudSignal Cloud = "signal" // SIGTERM/SIGINT to the agent
	CloudNone   Cloud = "none"
)

// Kind is what the notice means for the run.
type Kind string

const (
	// KindTermination: the machine goes away (terminate, stop, hibernate, preempt).
	KindTermination Kind = "termination"
	// KindRebalance: the risk of interruption rose; no deadline.
	KindRebalance Kind = "rebalance"
	// KindMaintenance: a scheduled event, Deadline is when it starts.
	KindMaintenance Kind = "maintenance"
	// KindCancelled: an earlier maintenance or termination notice (same ID) was withdrawn.
	KindCancelled Kind = "cancelled"
)

// Notice is one interruption signal, normalised across clouds.
type Notice struct {
	Cloud    Cloud     `json:"cloud"`
	Kind     Kind      `json:"kind"`
	ID       string    `json:"id"`                 // stable: the same event seen twice has the same ID
	Deadline time.Time `json:"deadline,omitempty"` // zero when the cloud gave none
	Detected time.Time `json:"detected"`           // when this agent saw it
	Action   string    `json:"action,omitempty"`   // cloud's own word: terminate, stop, Preempt, ...
	Raw      string    `json:"raw,omitempty"`      // the answer that carried it, for the journal
}

// Identity describes the machine, for logs, manifests and the journal.
type Identity struct {
	Cloud        Cloud  `json:"cloud"`
	InstanceID   string `json:"instance_id,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
	Zone         string `json:"zone,omitempty"`
	Lifecycle    string `json:"lifecycle,omitempty"` // spot, on-demand, preemptible, ...
	Name         string `json:"name,omitempty"`      // Azure VM name, GCE instance name
}

// Source watches one cloud's metadata service.
type Source interface {
	// Cloud names the source.
	Cloud() Cloud
	// Identity reads the machine's identity once.
	Identity(ctx context.Context) (Identity, error)
	// Watch delivers notices on out until ctx is done, then returns nil.
	// Each distinct notice is delivered once. Faults of the metadata service
	// are logged and retried with backoff; they never end Watch and never
	// produce a notice.
	Watch(ctx context.Context, out chan<- Notice) error
}

// Acker is implemented by sources whose cloud wants an acknowledgement once
// the agent is ready for the event (Azure Scheduled Events).
type Acker interface {
	Ack(ctx context.Context, noticeID string) error
}
