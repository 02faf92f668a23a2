// Package protocol is the trainer protocol's Go side. Protocol v1: one
// JSON object per line over a Unix stream socket, UTF-8, at most maxLine
// bytes per line. Every message has "type". Unknown fields are ignored; an
// unknown type gets an "error" reply and the connection stays open.
// docs/protocol.md is the reference for trainer authors.
package protocol

// The wire: the messages' types and constants, and the checks a message
// passes before the agent acts on it (Validate).

import (
	"encoding/json"
	"fmt"
	"time"
)

// maxLine is the longest accepted line, newline included.
const maxLine = 1 << 20

// ProtocolVersion is the newest version the agent speaks. A trainer says
// which it speaks in hello's version (absent: 1); welcome answers with the
// lower of the two. Version 2 adds the restore that runs while the trainer
// starts: a welcome with restore "pending", then restored or
// restore_failed. A version 1 trainer's welcome waits for the restore.
const ProtocolVersion = 2

// RestorePending and RestoreFailed are welcome's restore field: the
// restore runs beside the trainer's start (restored or restore_failed
// follows), or it failed (error says why). Absent: resume is final.
const (
	RestorePending = "pending"
	RestoreFailed  = "failed"
)

// Message types, trainer → agent.
const (
	TypeHello    = "hello"
	TypeProgress = "progress"
	TypeDone     = "done"
	TypeSaved    = "saved" // one file of a requested checkpoint is complete
	TypeFailed   = "failed"
	TypeStatus   = "status" // asks for a status reply (spotagent status)
	// TypeJoin: the job's ranks agreed on checkpoint id (another node's
	// agent asked for it); the agent answers with its own `checkpoint`
	// for that id, so that this node's ranks save their part of it.
	TypeJoin = "join"
	// TypeBye: the trainer finished its work and is about to exit 0
	// (the client's close after training). A sidecar told to stop once
	// every trainer said bye has nothing to save: no interruption.
	TypeBye = "bye"
)

// Message types, agent → trainer.
const (
	TypeWelcome      = "welcome"
	TypeCheckpoint   = "checkpoint"
	TypeCommitted    = "committed"
	TypeUploadFailed = "upload_failed"
	TypeStop         = "stop"
	TypeError        = "error"
	// TypeRestored ends a pending restore (protocol 2): resume is where the
	// trainer resumes from, absent for a definite fresh start.
	TypeRestored = "restored"
	// TypeRestoreFailed ends a pending restore that failed (protocol 2):
	// the trainer must not start fresh; error says why.
	TypeRestoreFailed = "restore_failed"
)

// TypeDisconnected marks the Event a Server emits when a connection ends.
// It is internal: never sent on the wire, and refused if a trainer sends it.
const TypeDisconnected = "disconnected"

// Checkpoint reasons.
const (
	ReasonPeriodic     = "periodic"
	ReasonInterruption = "interruption"
	ReasonShutdown     = "shutdown"
	ReasonManual       = "manual"
)

// Message is the union of every protocol message; each type uses the
// fields listed beside it and omits the rest.
type Message struct {
	Type string `json:"type"`

	// hello
	PID       int    `json:"pid,omitempty"`
	Rank      *int   `json:"rank,omitempty"`
	WorldSize *int   `json:"world_size,omitempty"`
	RunID     string `json:"run_id,omitempty"` // hello (node mode) and welcome
	Topology         // hello

	// progress, done, join
	Step *int64 `json:"step,omitempty"`

	// checkpoint, done, failed, committed, upload_failed, join
	ID string `json:"id,omitempty"`

	Saved // done, saved

	// failed, upload_failed, error
	Error string `json:"error,omitempty"`

	// welcome (and hello: the version the trainer speaks)
	Version       int     `json:"version,omitempty"`
	CheckpointDir string  `json:"checkpoint_dir,omitempty"`
	Resume        *Resume `json:"resume,omitempty"` // welcome, restored
	// welcome: RestorePending or RestoreFailed; absent when resume is final
	Restore string `json:"restore,omitempty"`

	// checkpoint, stop, join
	Reason   string     `json:"reason,omitempty"`
	Dir      string     `json:"dir,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`

	// committed
	URI string `json:"uri,omitempty"`

	// status reply
	Status json.RawMessage `json:"status,omitempty"`
}

// Topology is where a trainer sits in a torchrun job, sent in its hello
// from torchrun's environment when the trainer has it: the rank on its
// node, ranks per node, the node's rank and the node count. Embedded in
// Message: its fields stay on the message's top level on the wire.
type Topology struct {
	LocalRank      *int `json:"local_rank,omitempty"`
	LocalWorldSize *int `json:"local_world_size,omitempty"`
	NodeRank       *int `json:"node_rank,omitempty"`
	Nodes          *int `json:"nodes,omitempty"`
}

// Saved is what a trainer says of the files it wrote. Embedded in
// Message: its fields stay on the message's top level on the wire.
type Saved struct {
	// done
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// done: how long the trainer's training was blocked by this
	// checkpoint (staging it), when it saved in the background
	BlockedMS *int64 `json:"blocked_ms,omitempty"`

	// saved: the file, relative to the request's dir or absolute inside it
	Path string `json:"path,omitempty"`
}

// encodeLine encodes m as one protocol line, newline included.
func encodeLine(m Message) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Resume tells a trainer where the restored checkpoint is.
type Resume struct {
	Dir      string          `json:"dir"`
	Step     int64           `json:"step"`
	ID       string          `json:"id"`
	Manifest string          `json:"manifest"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Bounds of the numbers a trainer sends. Every message is checked against
// them where it enters (Conn.handle), so that nothing behind the socket
// sizes a slice, a duration or a sum from an absurd value (world_size 2^62
// once panicked in makeslice and took every run of a node agent down).
const (
	// MaxWorldSize bounds world_size, local_world_size and nodes (and so
	// rank, local_rank and node_rank): a million ranks.
	MaxWorldSize = 1 << 20
	// MaxStep bounds a step: 2^53, exact in a float64 and in every JSON
	// reader.
	MaxStep = 1 << 53
	// MaxBlockedMS bounds blocked_ms (about 35 years; a Duration holds it).
	MaxBlockedMS = 1 << 40
	// maxPID is Linux's highest pid_max.
	maxPID = 1 << 22
	// maxVersion bounds hello's protocol version.
	maxVersion = 1 << 16
)

// validate checks the numbers of m against the bounds above and against
// each other; the error names the message type and the field.
func (m Message) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: "+format, append([]any{m.Type}, a...)...)
	}
	if m.PID < 0 || m.PID > maxPID {
		return bad("pid %d out of range (0..%d)", m.PID, maxPID)
	}
	if m.Version < 0 || m.Version > maxVersion {
		return bad("version %d out of range (0..%d)", m.Version, maxVersion)
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"world_size", m.WorldSize}, {"local_world_size", m.LocalWorldSize}, {"nodes", m.Nodes}} {
		if f.v != nil && (*f.v < 1 || *f.v > MaxWorldSize) {
			return bad("%s %d out of range (1..%d)", f.name, *f.v, MaxWorldSize)
		}
	}
	for _, f := range []struct {
		name, of string
		v, n     *int
	}{{"rank", "world_size", m.Rank, m.WorldSize}, {"local_rank", "local_world_size", m.LocalRank, m.LocalWorldSize},
		{"node_rank", "nodes", m.NodeRank, m.Nodes}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v >= MaxWorldSize {
			return bad("%s %d out of range (0..%d)", f.name, *f.v, MaxWorldSize-1)
		}
		if f.n != nil && *f.v >= *f.n {
			return bad("%s %d must be below %s %d", f.name, *f.v, f.of, *f.n)
		}
	}
	if m.WorldSize != nil {
		if m.LocalWorldSize != nil && *m.LocalWorldSize > *m.WorldSize {
			return bad("local_world_size %d exceeds world_size %d", *m.LocalWorldSize, *m.WorldSize)
		}
		if m.Nodes != nil && *m.Nodes > *m.WorldSize {
			return bad("nodes %d exceeds world_size %d", *m.Nodes, *m.WorldSize)
		}
	}
	if m.Step != nil {
		if *m.Step < 0 {
			return bad("step is required and must be >= 0")
		}
		if *m.Step > MaxStep {
			return bad("step %d too large (at most %d)", *m.Step, int64(MaxStep))
		}
	}
	if m.BlockedMS != nil && (*m.BlockedMS < 0 || *m.BlockedMS > MaxBlockedMS) {
		return bad("blocked_ms %d out of range (0..%d)", *m.BlockedMS, int64(MaxBlockedMS))
	}
	return nil
}
