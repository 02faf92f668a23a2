package protocol

import "fmt"

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
