package storesim

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"

	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// OpTier is a nearby tier's read of one file (Tier.Open): a step of the
// schedule, which may fail (restore then asks the next tier, then the
// store) or find the actor's process dead.
const OpTier Kind = "tier"

// Lie is what a Tier hands back for one file.
type Lie int

// The answers of a Tier.
const (
	Honest    Lie = iota // the committed bytes
	Missing              // none (fs.ErrNotExist): the store's turn
	Stale                // another checkpoint's bytes of the same path
	Truncated            // a prefix of the committed bytes
	Forged               // other bytes of the same size and CRC32C (forge.Like)
)

func (l Lie) String() string {
	return [...]string{"honest", "missing", "stale", "truncated", "forged"}[l]
}

// Tier is a simulated nearby copy of committed checkpoints
// (checkpoint.Tier): a local disk or a peer, which holds what the store
// holds (a simplification: a copy is only offered while the store still
// has the object) and, file by file, may lie. What it answers for a file
// depends only on Seed, its name and the file's key, never on the order
// the schedule asks in.
type Tier struct {
	TierName string
	Store    *Store
	Seed     uint64
	// Lies are the answers drawn from, evenly (a value repeated weighs
	// more); empty: always Honest.
	Lies []Lie
	// Fake returns the other content a Stale or Forged answer starts
	// from (Forged then patches its last four bytes).
	Fake func(m *checkpoint.Manifest, f checkpoint.File, lie Lie) []byte
}

var _ checkpoint.Tier = (*Tier)(nil)

// Name names the tier.
func (t *Tier) Name() string { return t.TierName }

// LieFor is what t answers for f.
func (t *Tier) LieFor(f checkpoint.File) Lie {
	if len(t.Lies) == 0 {
		return Honest
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%s", t.Seed, t.TierName, f.Key)
	return t.Lies[h.Sum64()%uint64(len(t.Lies))]
}

// Open answers for file f of m: a step of the schedule (OpTier), then the
// committed bytes or a lie.
func (t *Tier) Open(ctx context.Context, m *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	op := Op{Kind: OpTier, Key: t.TierName + ":" + f.Key}
	if err := t.Store.before(ctx, op); err != nil {
		return nil, fmt.Errorf("%s tier: %w", t.TierName, err)
	}
	b, err := t.answer(m, f)
	if err = t.Store.after(ctx, op, err); err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (t *Tier) answer(m *checkpoint.Manifest, f checkpoint.File) ([]byte, error) {
	genuine, ok := t.Store.Peek(f.Key)
	lie := t.LieFor(f)
	if !ok || lie == Missing {
		return nil, fmt.Errorf("%s tier: %s: %w", t.TierName, f.Path, fs.ErrNotExist)
	}
	switch lie {
	case Stale:
		return t.Fake(m, f, lie), nil
	case Truncated:
		return genuine[:len(genuine)/2], nil
	case Forged:
		b, err := forge.Like(genuine, t.Fake(m, f, lie))
		if err != nil {
			return nil, fmt.Errorf("%s tier: %w", t.TierName, err)
		}
		return b, nil
	}
	return bytes.Clone(genuine), nil
}

// Peek returns the live object at key without passing through Faults (a
// copy): what a simulation's checks and its nearby tiers read.
func (s *Store) Peek(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.live(key); o != nil {
		return bytes.Clone(o.data), true
	}
	return nil, false
}
