// Package checkpoint is the store's layout and rules, which committing
// (pkg/checkpoint/commit), restoring (pkg/checkpoint/restore) and the
// journal (pkg/checkpoint/journal) share: the manifest and part manifests,
// latest.json (one writer), leases and fencing, listing and retention; and
// the local side: a checkpoint directory scanned and its files opened
// without following what a trainer could swap in, checksums, progress, and
// the Tier contract of copies nearer than the store.
package checkpoint

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
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
