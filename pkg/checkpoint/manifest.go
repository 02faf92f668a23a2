// Package checkpoint is the store's layout and rules, which committing
// (pkg/checkpoint/commit), restoring (pkg/checkpoint/restore) and the
// journal (pkg/checkpoint/journal) share: the manifest and part manifests,
// latest.json (one writer), leases and fencing, listing and retention; and
// the local side: a checkpoint directory scanned and its files opened
// without following what a trainer could swap in, checksums, progress, and
// the Tier contract of copies nearer than the store.
package checkpoint

// The manifest and its part manifests: what a committed checkpoint is (its
// files, their sizes, CRC32Cs and digests), the keys it lives under, the
// checks a manifest passes before anyone trusts it, a multi-node job's part
// manifests and how they assemble; and the checksums that verify each
// file (CRC32C, BLAKE3 or SHA-256, one pass while copying).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

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
	Epoch    int64           `json:"epoch,omitempty"` // session lease it was committed under (the lease, latest.go); 0: none
	// Parts lists the parts of a job checkpoint (several nodes, below),
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
	// CRC32C of the content, 8 hex digits (below): the store
	// download's transfer check. SHA256 (64 hex digits) is what versions
	// before CRC32C wrote instead: a store download checks whichever is
	// set, CRC32C first.
	CRC32C string `json:"crc32c,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// BLAKE3 of the content, 64 hex digits (below): the digest a
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
	Epoch    int64     `json:"epoch,omitempty"` // newest session lease that wrote it (the lease, latest.go)
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

// Checksums. A manifest records one checksum per file, taken while the
// file is uploaded: CRC32C (Castagnoli), the checksum GCS keeps for every
// object and S3 verifies on every part and, for multipart objects, on the
// whole object (full-object CRC32C). With SSE4.2 it costs ~0.04 core-s per
// GiB where sha256 cost ~0.6 (docs/storage.md, "Checksums"). Manifests
// written before it carry sha256 instead; a store download verifies
// whichever the manifest has.
//
// Four bytes forge a CRC: other bytes of the same size and CRC32C are
// easy to make. So since #46 the manifest also records a digest, BLAKE3,
// taken in the same pass, and a copy nearer than the store (the local
// tier, a peer, a replica, a reused restore directory) is used only once
// its bytes match it (VerifyDigest, CopyDigestVerified). BLAKE3 rather
// than sha256: on this project's 2-core AMD EPYC (SHA-NI, AVX-512), alone
// over 256 KiB chunks, sha256 took 0.69-0.75 core-s per GiB, BLAKE3
// (github.com/zeebo/blake3) 0.36-0.38 and CRC32C 0.05 (spotbench -only
// digest). A file whose entry has no digest (a CRC-only manifest) is read
// from the store only; the sha256 of pre-CRC manifests counts as a digest.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewCRC32C returns a CRC32C hash (hardware accelerated where the CPU has
// it: SSE4.2 on amd64, CRC32 instructions on arm64).
func NewCRC32C() hash.Hash32 { return crc32.New(castagnoli) }

// CRC32CHex is how a manifest writes a CRC32C: 8 lowercase hex digits,
// big-endian (the byte order of S3's and GCS's base64 form).
func CRC32CHex(v uint32) string { return fmt.Sprintf("%08x", v) }

// Digest returns a fresh hash of the kind f's manifest entry records, the
// value it must produce (hex), and its name for messages.
func (f File) Digest() (h hash.Hash, want, name string) {
	if f.CRC32C != "" {
		return NewCRC32C(), f.CRC32C, "crc32c"
	}
	return sha256.New(), f.SHA256, "sha256"
}

// NewDigest returns a fresh hash of the digest this version records:
// BLAKE3-256.
func NewDigest() hash.Hash { return blake3.New() }

// ErrNoDigest means f's manifest entry records no digest (a manifest
// written before #46, with CRC32C only): only the store's copy of it may
// be used.
var ErrNoDigest = errors.New("manifest records no digest for the file")

// HasDigest reports whether f records a cryptographic digest a nearby
// copy can be checked against: BLAKE3, or the sha256 of a manifest from
// before CRC32C.
func (f File) HasDigest() bool { return f.BLAKE3 != "" || f.SHA256 != "" }

// strong returns a fresh hash of f's digest, the value it must produce and
// its name; h is nil when f records none.
func (f File) strong() (h hash.Hash, want, name string) {
	switch {
	case f.BLAKE3 != "":
		return NewDigest(), f.BLAKE3, "blake3"
	case f.SHA256 != "":
		return sha256.New(), f.SHA256, "sha256"
	}
	return nil, "", ""
}

// Verify reads r to its end and checks it against f: the size, and the
// checksum the manifest records (CRC32C, or sha256 in older manifests):
// a store download's check. A mismatch wraps ErrCorrupt.
func (f File) Verify(r io.Reader) error {
	h, want, name := f.Digest()
	return verify(r, f.Size, h, want, name)
}

// VerifyDigest reads r to its end and checks it against f's size and
// digest: a nearby copy's check, which other bytes of the same CRC32C
// fail. ErrNoDigest when f records none; a mismatch wraps ErrCorrupt.
func (f File) VerifyDigest(r io.Reader) error {
	h, want, name := f.strong()
	if h == nil {
		return fmt.Errorf("%s: %w", f.Path, ErrNoDigest)
	}
	return verify(r, f.Size, h, want, name)
}

func verify(r io.Reader, size int64, h hash.Hash, want, name string) error {
	n, err := io.Copy(h, io.LimitReader(r, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return SizeMismatch(n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s %s, manifest says %s", ErrCorrupt, name, got, want)
	}
	return nil
}

// SameContent reports whether a and b record the same content: the same
// size and checksum (of the same kind).
func (f File) SameContent(g File) bool {
	return f.Size == g.Size && f.CRC32C == g.CRC32C && f.SHA256 == g.SHA256 && f.BLAKE3 == g.BLAKE3
}

// Sums takes a file's CRC32C and digest in one pass: each write is hashed
// by both while it is in the CPU's cache (CountingReader hands it
// hashChunk bytes at a time).
type Sums struct {
	crc hash.Hash32
	dig hash.Hash
	n   int64
}

// NewSums returns empty Sums.
func NewSums() *Sums { return &Sums{crc: NewCRC32C(), dig: NewDigest()} }

func (s *Sums) Write(p []byte) (int, error) {
	s.crc.Write(p)
	s.dig.Write(p)
	s.n += int64(len(p))
	return len(p), nil
}

// Len is the bytes written.
func (s *Sums) Len() int64 { return s.n }

// CRC32C is the CRC32C of what was written, as a manifest writes it.
func (s *Sums) CRC32C() string { return CRC32CHex(s.crc.Sum32()) }

// Digest is the digest of what was written, as a manifest writes it.
func (s *Sums) Digest() string { return hex.EncodeToString(s.dig.Sum(nil)) }

// crc32cCombine returns the CRC32C of A followed by B from crcA, crcB and
// the length of B (zlib's crc32_combine, for the Castagnoli polynomial):
// the CRC of an object downloaded in ranges, from the ranges' CRCs.
func crc32cCombine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	var even, odd [32]uint32
	odd[0] = 0x82f63b78 // Castagnoli, reflected
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // the operator for two zero bits
	gf2Square(&odd, &even) // four
	for {
		gf2Square(&even, &odd) // one zero byte, then 4, 16, ...
		if lenB&1 != 0 {
			crcA = gf2Times(&even, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
		gf2Square(&odd, &even)
		if lenB&1 != 0 {
			crcA = gf2Times(&odd, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}

// CRCWriterAt takes the CRC32C of what is written through it at any
// offsets, as runs of contiguous writes (a ranged download writes each
// range in order, several ranges at once): the file's CRC32C without
// reading it back.
type CRCWriterAt struct {
	w    io.WriterAt
	mu   sync.Mutex
	runs map[int64]*crcRun // by end offset
}

type crcRun struct {
	off, n int64
	crc    uint32
}

// NewCRCWriterAt wraps w, taking the CRC32C of each range written (Sum).
func NewCRCWriterAt(w io.WriterAt) *CRCWriterAt {
	return &CRCWriterAt{w: w, runs: map[int64]*crcRun{}}
}

func (c *CRCWriterAt) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.w.WriteAt(p, off)
	if n > 0 {
		c.mu.Lock()
		r := c.runs[off]
		if r == nil {
			r = &crcRun{off: off}
		} else {
			delete(c.runs, off)
		}
		r.crc = crc32.Update(r.crc, castagnoli, p[:n])
		r.n += int64(n)
		c.runs[r.off+r.n] = r
		c.mu.Unlock()
	}
	return n, err
}

// Sum is the CRC32C of [0, size) if the writes covered exactly that, each
// byte once; ok is false otherwise (a range written twice, a gap).
func (c *CRCWriterAt) Sum(size int64) (crc uint32, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	runs := make([]*crcRun, 0, len(c.runs))
	for _, r := range c.runs {
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].off < runs[j].off })
	var at int64
	for _, r := range runs {
		if r.off != at {
			return 0, false
		}
		crc = crc32cCombine(crc, r.crc, r.n)
		at += r.n
	}
	return crc, at == size
}

// ErrCorrupt marks an object whose size or checksum differs from its manifest.
var ErrCorrupt = errors.New("checkpoint damaged")

// SizeMismatch is the ErrCorrupt of an object of size got whose manifest
// says want.
func SizeMismatch(got, want int64) error {
	return fmt.Errorf("%w: size %d, manifest says %d", ErrCorrupt, got, want)
}

// CopyVerified copies f's content from r to w, counting it into p, and
// checks its size (at most f.Size+1 bytes are read) and checksum against
// f as it goes: the caller's copy is what the manifest says, or an error.
// The checksum is the store's transfer check (CRC32C, or an old
// manifest's sha256); a nearby copy is checked by CopyDigestVerified.
func CopyVerified(w io.Writer, r io.Reader, f File, p *Progress) error {
	h, want, name := f.Digest()
	return copyChecked(w, r, f, p, h, want, name)
}

// CopyDigestVerified is CopyVerified against f's digest: how a copy nearer
// than the store (local tier, peer, replica) is read. ErrNoDigest, reading
// nothing, when f records none; a mismatch wraps ErrCorrupt, and the
// caller must discard what was written.
func CopyDigestVerified(w io.Writer, r io.Reader, f File, p *Progress) error {
	h, want, name := f.strong()
	if h == nil {
		return fmt.Errorf("%s: %w", f.Path, ErrNoDigest)
	}
	return copyChecked(w, r, f, p, h, want, name)
}

func copyChecked(w io.Writer, r io.Reader, f File, p *Progress, h hash.Hash, want, name string) error {
	lr := io.LimitReader(r, f.Size+1)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		// Each read is hashed as it lands and written once minWrite
		// bytes are in: filling buf first (io.ReadFull) takes many short
		// reads once the reader is ahead of the socket, each parking
		// until more comes, and the bytes leave the CPU's cache.
		n := 0
		var err error
		for n < minWrite && err == nil {
			var m int
			m, err = lr.Read(buf[n:])
			for off := n; off < n+m; off += hashChunk {
				h.Write(buf[off:min(off+hashChunk, n+m)])
			}
			n += m
		}
		if n > 0 {
			total += int64(n)
			if p != nil {
				p.Add(n)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if total != f.Size {
		return SizeMismatch(total, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s %s, manifest says %s", ErrCorrupt, name, got, want)
	}
	return nil
}

// copyBufs are CopyVerified's buffers. Each read (up to 1 MiB, straight
// from the socket past an HTTP client's 256 KiB read buffer) is hashed in
// hashChunk steps as it lands and written at once, or with the next reads
// while fewer than minWrite bytes are in: against io.Copy into the
// *os.File (32 KiB reads through that buffer, one copy more, and 32 KiB
// writes), a peer transfer into a verified file went from 600–690 to
// 840–1,140 MiB/s on a shared 2-core loopback (BenchmarkTransfer,
// peertier). Filling the whole buffer before writing it cost the receiver
// 1.8–2.5 CPU-s per GiB between two network namespaces on a loaded
// machine (perf: the write's copy into the page cache, 10× the cost of the
// same bytes written as they came), against 0.7–0.85 read by read, as a
// plain TCP stream into a file costs (spotbench -only peernet).
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// minWrite gathers short reads (a TLS body's 16 KiB records) into one
// write: written one by one they cost twice the CPU of 1 MiB writes; in
// 64 KiB, a tenth more. A socket read of a fast stream brings more.
const minWrite = 64 << 10
