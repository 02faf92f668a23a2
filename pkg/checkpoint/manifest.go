// Package checkpoint is the store's layout and rules, which committing
// (pkg/checkpoint/commit), restoring (pkg/checkpoint/restore) and the
// journal (pkg/checkpoint/journal) share: the manifest and part manifests,
// latest.json (one writer), leases and fencing, listing and retention; and
// the local side: a checkpoint directory scanned and its files opened
// without following what a trainer could swap in, checksums, progress, and
// the Tier contract of copies nearer than the store.
package checkpoint

// The manifest and its part manifests: what a committed checkpoint is (its
// files, their sizes, CRC32Cs and digests), the keys it lives under, and the
// checks a manifest passes before anyone trusts it; a multi-node job's part
// manifests, one per node, and how they assemble into the manifest.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Format names the manifest schema.
const Format = "spotagent.checkpoint/v1"

// Store keys, relative to the store root.
const (
	LatestKey      = "latest.json"
	JournalKey     = "journal.json"
	CheckpointsDir = "checkpoints/"
	ManifestName   = "manifest.json"
)

// Manifest describes one committed checkpoint. It is written only after
// every object it lists is durable, so its presence means "complete".
type Manifest struct {
	Format   string          `json:"format"`
	RunID    string          `json:"run_id"`
	ID       string          `json:"id"`
	Step     int64           `json:"step"`
	Reason   string          `json:"reason"`
	Created  time.Time       `json:"created"`
	Source   Machine         `json:"source"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Files    []File          `json:"files"`
	Epoch    int64           `json:"epoch,omitempty"` // session lease it was committed under (lease.go); 0: none
	// Parts lists the parts of a job checkpoint (several nodes, parts.go),
	// ordered by their lowest rank; empty for a single-node checkpoint.
	Parts []PartInfo `json:"parts,omitempty"`
}

// Machine is the machine a checkpoint, session or lease came from, as the
// manifest, journal and lease record it. The on-disk formats own this
// schema: the agent converts metadata.Identity into it (the same JSON
// fields), so that a change to the metadata package cannot change them.
type Machine struct {
	Cloud        string `json:"cloud"`
	InstanceID   string `json:"instance_id,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
	Zone         string `json:"zone,omitempty"`
	Lifecycle    string `json:"lifecycle,omitempty"` // spot, on-demand, preemptible, ...
	Name         string `json:"name,omitempty"`      // Azure VM name, GCE instance name
}

// File is one object of a checkpoint.
type File struct {
	Path string `json:"path"` // relative to the checkpoint directory, "/"-separated
	Key  string `json:"key"`  // object key relative to the store root
	Size int64  `json:"size"`
	// CRC32C of the content, 8 hex digits (checksum.go): the store
	// download's transfer check. SHA256 (64 hex digits) is what versions
	// before CRC32C wrote instead: a store download checks whichever is
	// set, CRC32C first.
	CRC32C string `json:"crc32c,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// BLAKE3 of the content, 64 hex digits (checksum.go): the digest a
	// copy nearer than the store (local tier, peer, replica, a reused
	// restore directory) must match before any of its bytes is used.
	// Written since #46, with CRC32C; older readers ignore it.
	BLAKE3 string `json:"blake3,omitempty"`
	Part   string `json:"part,omitempty"` // the part (node) that wrote it, in a job checkpoint
}

// Latest is the content of latest.json: a pointer to the newest manifest.
type Latest struct {
	Manifest string    `json:"manifest"`
	Step     int64     `json:"step"`
	ID       string    `json:"id"`
	Updated  time.Time `json:"updated"`
	Epoch    int64     `json:"epoch,omitempty"` // newest session lease that wrote it (lease.go)
}

// PointsAt is the step of the manifest l points at, as its key names it:
// what restore and UpdateLatest trust over l.Step, which a damaged or
// hand-edited latest.json can get wrong (a step too high would otherwise
// keep every later commit from moving it). l.Step when the key names none.
func (l Latest) PointsAt() int64 {
	if s := StepOf(DirOf(l.Manifest)); s >= 0 {
		return s
	}
	return l.Step
}

// Prefix returns the store prefix of a checkpoint, ending in "/".
func Prefix(step int64, id string) string {
	return fmt.Sprintf("%s%012d-%s/", CheckpointsDir, step, id)
}

// ManifestKey returns the key of a checkpoint's manifest.
func ManifestKey(step int64, id string) string { return Prefix(step, id) + ManifestName }

// Bytes is the sum of the file sizes.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Validate checks what restore relies on: a known format, safe relative
// paths and keys, and well-formed sizes and checksums.
func (m *Manifest) Validate() error {
	if m.Format != Format {
		return fmt.Errorf("unknown manifest format %q", m.Format)
	}
	if m.ID == "" || !validID(m.ID) {
		return fmt.Errorf("bad checkpoint id %q", m.ID)
	}
	if m.Step < 0 {
		return fmt.Errorf("negative step %d", m.Step)
	}
	if err := ValidateFiles(m.Files); err != nil {
		return err
	}
	return m.validateParts()
}

// ValidateFiles checks each file's path, key, size and checksum, and that
// the files of one part (files with the same Part) can be laid out on disk:
// no path twice, no path that is also another's directory.
func ValidateFiles(files []File) error {
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		if err := SafeRel(f.Path); err != nil {
			return fmt.Errorf("file path: %w", err)
		}
		if err := SafeRel(f.Key); err != nil {
			return fmt.Errorf("file key: %w", err)
		}
		if seen[f.Part+"\x00"+f.Path] {
			return fmt.Errorf("duplicate file %q", f.Path)
		}
		seen[f.Part+"\x00"+f.Path] = true
		if f.Size < 0 {
			return fmt.Errorf("file %q: negative size", f.Path)
		}
		if f.CRC32C == "" && f.SHA256 == "" {
			return fmt.Errorf("file %q: no checksum", f.Path)
		}
		if b, err := hex.DecodeString(f.CRC32C); f.CRC32C != "" && (err != nil || len(b) != 4 || f.CRC32C != strings.ToLower(f.CRC32C)) {
			return fmt.Errorf("file %q: bad crc32c %q", f.Path, f.CRC32C)
		}
		if b, err := hex.DecodeString(f.SHA256); f.SHA256 != "" && (err != nil || len(b) != 32) {
			return fmt.Errorf("file %q: bad sha256 %q", f.Path, f.SHA256)
		}
		if b, err := hex.DecodeString(f.BLAKE3); f.BLAKE3 != "" && (err != nil || len(b) != 32 || f.BLAKE3 != strings.ToLower(f.BLAKE3)) {
			return fmt.Errorf("file %q: bad blake3 %q", f.Path, f.BLAKE3)
		}
	}
	// A path that is also another's directory ("a" and "a/b") cannot be
	// laid out on disk: such a manifest is broken, not a local fault.
	for _, f := range files {
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) {
			if seen[f.Part+"\x00"+d] {
				return fmt.Errorf("file %q is also the directory of %q", d, f.Path)
			}
		}
	}
	return nil
}

// ErrUnsafePath reports a path that could leave its directory.
var ErrUnsafePath = errors.New("unsafe path")

// SafeRel accepts a relative path of a checkpoint's file: the same rule as
// a store key (cloud.ValidKey), reported as ErrUnsafePath.
func SafeRel(p string) error {
	if cloud.ValidKey(p) != nil {
		return fmt.Errorf("%w: %q", ErrUnsafePath, p)
	}
	return nil
}

// validID accepts ids usable in a key: letters, digits, '-', '_' and '.'.
func validID(id string) bool {
	if len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
		if !ok {
			return false
		}
	}
	return true
}

// ValidID reports whether id can name a checkpoint (or a run).
func ValidID(id string) bool { return id != "" && validID(id) }

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
