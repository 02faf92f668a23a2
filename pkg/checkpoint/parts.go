package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// A job checkpoint is made of parts, one per node (one agent each):
//
//	checkpoints/<step:012d>-<id>/<node>/<path...>    data objects of one part
//	checkpoints/<step:012d>-<id>/parts/<node>.json   part manifest, if-absent, after its data
//	checkpoints/<step:012d>-<id>/manifest.json       job manifest, if-absent, once every part is durable
//	latest.json                                      compare-and-swap, after the manifest
//
// Every agent of the job commits its own part and then waits for the
// others; whichever sees the parts complete first writes manifest.json
// (if-absent: one writer wins, the others read and accept it). docs/storage.md
// has the argument.

// PartFormat names the part manifest schema.
const PartFormat = "spotagent.part/v1"

// PartsDir holds the part manifests of a job checkpoint.
const PartsDir = "parts/"

// ErrPartsDisagree means the parts of a job checkpoint cannot make one
// checkpoint (a rank claimed twice, different world sizes or runs, a
// broken part manifest): it is never committed.
var ErrPartsDisagree = errors.New("checkpoint parts disagree")

// PartSpec names this node's part of a job checkpoint.
type PartSpec struct {
	Node      string // part name, "node-<k>"; a valid id other than "parts"
	Ranks     []int  // the job ranks whose files this part holds
	WorldSize int    // ranks in the whole job
}

// PartInfo is a part as the job manifest lists it.
type PartInfo struct {
	Node  string `json:"node"`
	Ranks []int  `json:"ranks"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
	// Source is the machine that wrote the part (its part manifest's),
	// when the metadata named one: where --replicas places its copy
	// (pkg/checkpoint/peertier, placement.go).
	Source *Machine `json:"source,omitempty"`
}

// PartManifest is the content of parts/<node>.json: one node's files of a
// job checkpoint. It is written only after every object it lists is durable.
type PartManifest struct {
	Format    string          `json:"format"`
	RunID     string          `json:"run_id"`
	ID        string          `json:"id"`
	Step      int64           `json:"step"`
	Reason    string          `json:"reason"`
	Node      string          `json:"node"`
	Ranks     []int           `json:"ranks"`
	WorldSize int             `json:"world_size"`
	Created   time.Time       `json:"created"`
	Source    Machine         `json:"source"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	Files     []File          `json:"files"`
}

// PartPrefix is the store prefix of one part's data objects, ending in "/".
func PartPrefix(step int64, id, node string) string { return Prefix(step, id) + node + "/" }

// PartKey is the key of one part's manifest.
func PartKey(step int64, id, node string) string {
	return Prefix(step, id) + PartsDir + node + ".json"
}

// validNode accepts a part name that cannot clash with the other names in
// a checkpoint's prefix.
func validNode(node string) bool {
	return ValidID(node) && node != strings.TrimSuffix(PartsDir, "/") && node != ManifestName
}

// Validate checks a PartSpec before anything is uploaded.
func (p *PartSpec) Validate() error {
	if !validNode(p.Node) {
		return fmt.Errorf("bad part name %q", p.Node)
	}
	return checkRanks(p.Ranks, p.WorldSize)
}

func checkRanks(ranks []int, world int) error {
	if world < 1 {
		return fmt.Errorf("world size %d", world)
	}
	if len(ranks) == 0 {
		return errors.New("no ranks")
	}
	seen := map[int]bool{}
	for _, r := range ranks {
		if r < 0 || r >= world {
			return fmt.Errorf("rank %d outside world size %d", r, world)
		}
		if seen[r] {
			return fmt.Errorf("rank %d twice", r)
		}
		seen[r] = true
	}
	return nil
}

// Validate checks a part manifest as Validate checks a manifest.
func (p *PartManifest) Validate() error {
	if p.Format != PartFormat {
		return fmt.Errorf("unknown part format %q", p.Format)
	}
	if !ValidID(p.ID) {
		return fmt.Errorf("bad checkpoint id %q", p.ID)
	}
	if p.Step < 0 {
		return fmt.Errorf("negative step %d", p.Step)
	}
	if !validNode(p.Node) {
		return fmt.Errorf("bad part name %q", p.Node)
	}
	if err := checkRanks(p.Ranks, p.WorldSize); err != nil {
		return fmt.Errorf("part %s: %w", p.Node, err)
	}
	if len(p.Files) == 0 {
		return fmt.Errorf("part %s: no files", p.Node)
	}
	for _, f := range p.Files {
		if f.Part != p.Node {
			return fmt.Errorf("part %s: file %q names part %q", p.Node, f.Path, f.Part)
		}
	}
	return ValidateFiles(p.Files)
}

// validateParts checks a job manifest's parts: every file belongs to a
// listed part, each part's counts match its files, and the parts' ranks
// cover 0..n-1 exactly once. A single-node manifest has no parts and no
// file names one.
func (m *Manifest) validateParts() error {
	if len(m.Parts) == 0 {
		for _, f := range m.Files {
			if f.Part != "" {
				return fmt.Errorf("file %q names part %q, the manifest lists no parts", f.Path, f.Part)
			}
		}
		return nil
	}
	type count struct {
		files int
		bytes int64
	}
	got := map[string]*count{}
	var ranks []int
	for _, p := range m.Parts {
		if !validNode(p.Node) || got[p.Node] != nil {
			return fmt.Errorf("bad or duplicate part %q", p.Node)
		}
		got[p.Node] = &count{}
		ranks = append(ranks, p.Ranks...)
	}
	slices.Sort(ranks)
	for i, r := range ranks {
		if r != i {
			return fmt.Errorf("part ranks %v do not cover 0..%d once", ranks, len(ranks)-1)
		}
	}
	for _, f := range m.Files {
		c := got[f.Part]
		if c == nil {
			return fmt.Errorf("file %q names unknown part %q", f.Path, f.Part)
		}
		c.files++
		c.bytes += f.Size
	}
	for _, p := range m.Parts {
		if c := got[p.Node]; c.files != p.Files || c.bytes != p.Bytes {
			return fmt.Errorf("part %s: lists %d files, %d bytes; the manifest holds %d, %d", p.Node, p.Files, p.Bytes, c.files, c.bytes)
		}
	}
	return nil
}

// Part returns the part named node, or nil.
func (m *Manifest) Part(node string) *PartInfo {
	for i := range m.Parts {
		if m.Parts[i].Node == node {
			return &m.Parts[i]
		}
	}
	return nil
}

// PartBytes is the size of the files of part node.
func (m *Manifest) PartBytes(node string) int64 {
	var n int64
	for _, f := range m.Files {
		if f.Part == node {
			n += f.Size
		}
	}
	return n
}

// ReadPart reads and validates a part manifest. One that does not parse,
// validate or belong at its key is ErrPartsDisagree.
func ReadPart(ctx context.Context, st cloud.Store, key string) (*PartManifest, error) {
	var p PartManifest
	if err := ReadJSON(ctx, st, key, MaxManifest, &p); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syn) || errors.As(err, &typ) {
			return nil, fmt.Errorf("%w: %w", ErrPartsDisagree, err)
		}
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("part %s: %w: %w", key, ErrPartsDisagree, err)
	}
	if want := PartKey(p.Step, p.ID, p.Node); want != key {
		return nil, fmt.Errorf("part %s: names step %d id %s node %s, which belong at %s: %w", key, p.Step, p.ID, p.Node, want, ErrPartsDisagree)
	}
	return &p, nil
}

// PartCleanup is what an agent in part mode passes to cloud.Cleaner: it
// removes only the leftovers of its own part's uploads (keys under
// checkpoints/<dir>/<node>/), and anyone's older than a day. The other
// agents of the job may have uploads in flight under their own parts.
func PartCleanup(node string) cloud.CleanupOptions {
	return cloud.CleanupOptions{Owned: func(key string) bool {
		rest, ok := strings.CutPrefix(key, CheckpointsDir)
		if !ok {
			return false
		}
		_, rest, ok = strings.Cut(rest, "/")
		return ok && strings.HasPrefix(rest, node+"/")
	}}
}
