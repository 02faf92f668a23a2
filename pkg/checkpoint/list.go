package checkpoint

// The store's committed checkpoints as a listing: manifests read and
// decoded (a damaged one named), listed newest first, incomplete uploads
// found; retention (which checkpoints are pruned, which kept) and the keys'
// layout (a manifest's key, its directory, its step).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/spotagent/spotagent/pkg/cloud"
	"go.uber.org/zap"
)

// MaxManifest bounds what is read as a manifest: a checkpoint of 100,000
// files fits well inside it.
const MaxManifest = 64 << 20

// Entry is one manifest found in a store. Err is set when it could not be
// read or does not validate; such an entry is never restored from.
type Entry struct {
	Key      string
	Manifest *Manifest
	Err      error
}

// ReadManifest reads and validates one manifest. It is decoded as it is
// read, one file entry at a time: a manifest of tens of MiB costs the
// memory of its entries, not also of its bytes.
func ReadManifest(ctx context.Context, st cloud.Store, key string) (*Manifest, error) {
	r, err := st.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	defer r.Close()
	rr := &readErr{r: r}
	lr := &io.LimitedReader{R: rr, N: MaxManifest + 1}
	m, err := DecodeManifest(lr)
	if lr.N <= 0 {
		return nil, badManifest{fmt.Errorf("read %s: larger than %d bytes", key, MaxManifest)}
	}
	if rr.err != nil {
		return nil, fmt.Errorf("read %s: %w", key, rr.err) // the store's failure, not the manifest's
	}
	if err != nil {
		return nil, badManifest{fmt.Errorf("parse %s: %w", key, err)}
	}
	if err := m.Validate(); err != nil {
		return nil, badManifest{fmt.Errorf("manifest %s: %w", key, err)}
	}
	if want := ManifestKey(m.Step, m.ID); want != key {
		return nil, badManifest{fmt.Errorf("manifest %s: names step %d id %s, which belong at %s", key, m.Step, m.ID, want)}
	}
	return m, nil
}

// badManifest marks a manifest that was read whole but is not one restore
// can use (too large, does not parse or validate): unlike a failed read,
// reading it again would not help.
type badManifest struct{ error }

func (b badManifest) Unwrap() error { return b.error }

// isBadManifest reports whether err, from ReadManifest, is the manifest's
// fault rather than the store's.
func isBadManifest(err error) bool {
	var b badManifest
	return errors.As(err, &b)
}

// ManifestDamaged reports whether err, from ReadManifest, says the
// manifest is gone or unusable (a restore passes over it) rather than that
// the store failed to answer (a restore must not: an older checkpoint
// would be a rollback).
func ManifestDamaged(err error) bool {
	return errors.Is(err, cloud.ErrNotExist) || isBadManifest(err)
}

// readErr remembers the error its reader returned, other than io.EOF.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// DecodeManifest decodes one manifest object from r as json.Unmarshal
// would (unknown fields ignored, keys matched case-insensitively, the
// last of a repeated key wins), streaming the "files" array entry by
// entry; the other fields are small and decoded at the end.
func DecodeManifest(r io.Reader) (*Manifest, error) {
	dec := json.NewDecoder(r)
	if t, err := dec.Token(); err != nil {
		return nil, err
	} else if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	rest := map[string]json.RawMessage{}
	var files []File
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := t.(string)
		if !strings.EqualFold(k, "files") {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, err
			}
			rest[k] = v
			continue
		}
		files = nil
		if t, err = dec.Token(); err != nil {
			return nil, err
		}
		if t == nil { // "files": null
			continue
		}
		if d, ok := t.(json.Delim); !ok || d != '[' {
			return nil, errors.New("files: not an array")
		}
		for dec.More() {
			var f File
			if err := dec.Decode(&f); err != nil {
				return nil, fmt.Errorf("files: %w", err)
			}
			files = append(files, f)
		}
		if _, err := dec.Token(); err != nil { // ]
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil { // }
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the manifest object")
	}
	b, err := json.Marshal(rest)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m.Files = files
	return &m, nil
}

// ListManifests returns every manifest under checkpoints/, newest first
// (highest step, then latest created). Unreadable manifests are included
// with Err set so that callers can report them.
func ListManifests(ctx context.Context, st cloud.Store) ([]Entry, error) {
	keys, err := ListManifestKeys(ctx, st)
	if err != nil {
		return nil, err
	}
	return readManifests(ctx, st, keys)
}

// ListManifestKeys lists the keys of every manifest under checkpoints/
// without reading them.
func ListManifestKeys(ctx context.Context, st cloud.Store) ([]string, error) {
	var keys []string
	err := st.List(ctx, CheckpointsDir, func(o cloud.ObjectInfo) error {
		rest := strings.TrimPrefix(o.Key, CheckpointsDir)
		if dir, name, ok := strings.Cut(rest, "/"); ok && dir != "" && name == ManifestName {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	return keys, nil
}

// readManifests reads the manifests at keys, newest first.
func readManifests(ctx context.Context, st cloud.Store, keys []string) ([]Entry, error) {
	entries := make([]Entry, 0, len(keys))
	for _, k := range keys {
		m, err := ReadManifest(ctx, st, k)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		entries = append(entries, Entry{Key: k, Manifest: m, Err: err})
	}
	sort.SliceStable(entries, func(i, j int) bool { return Newer(entries[i], entries[j]) })
	return entries, nil
}

// Newer orders entries newest first; broken ones last, by key.
func Newer(a, b Entry) bool {
	if (a.Err == nil) != (b.Err == nil) {
		return a.Err == nil
	}
	if a.Err != nil {
		return a.Key > b.Key
	}
	if a.Manifest.Step != b.Manifest.Step {
		return a.Manifest.Step > b.Manifest.Step
	}
	return a.Manifest.Created.After(b.Manifest.Created)
}

// Incomplete is a job checkpoint some parts of which are in the store but
// whose manifest is not: still being assembled, or abandoned.
type Incomplete struct {
	Step    int64
	ID      string
	Parts   []*PartManifest // readable parts, by node
	Missing []int           // ranks no readable part holds, per the first part's world size
	Err     error           // a part that could not be read
}

// ListIncomplete lists the job checkpoints that have parts and no
// manifest, newest first.
func ListIncomplete(ctx context.Context, st cloud.Store) ([]Incomplete, error) {
	partKeys := map[string][]string{}
	hasManifest := map[string]bool{}
	err := st.List(ctx, CheckpointsDir, func(o cloud.ObjectInfo) error {
		d := DirOf(o.Key)
		switch rest := strings.TrimPrefix(o.Key, d); {
		case rest == ManifestName:
			hasManifest[d] = true
		case strings.HasPrefix(rest, PartsDir) && strings.HasSuffix(rest, ".json"):
			partKeys[d] = append(partKeys[d], o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var out []Incomplete
	for d, keys := range partKeys {
		if hasManifest[d] {
			continue
		}
		in := Incomplete{Step: StepOf(d)}
		_, in.ID, _ = strings.Cut(strings.TrimSuffix(strings.TrimPrefix(d, CheckpointsDir), "/"), "-")
		for _, k := range keys {
			p, err := ReadPart(ctx, st, k)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err != nil {
				in.Err = err
				continue
			}
			in.Parts = append(in.Parts, p)
		}
		if len(in.Parts) > 0 {
			held := map[int]bool{}
			for _, p := range in.Parts {
				for _, r := range p.Ranks {
					held[r] = true
				}
			}
			for r := range in.Parts[0].WorldSize {
				if !held[r] {
					in.Missing = append(in.Missing, r)
				}
			}
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Step != out[j].Step {
			return out[i].Step > out[j].Step
		}
		return out[i].ID > out[j].ID
	})
	return out, nil
}

// Prune keeps the newest keep restorable checkpoints (complete: every
// object listed with its size; and not a fenced session's, which restore
// skips), always the one latest.json names and the manifests named in pin
// (say, the checkpoint just committed, whatever its step, read even when
// the listing does not show it yet), and every checkpoint above the oldest
// of those kept that is not restorable now (damaged, or fenced: a person
// may want it, and it costs nothing restore relies on). It deletes the
// others. Each checkpoint loses its manifest first, so a half-deleted
// checkpoint is never restorable; then every object that no kept manifest
// lists goes. Objects without a manifest (an upload a crash cut short, or
// the parts of a job checkpoint that never completed) are removed only
// when they are older by step than the oldest kept checkpoint: an upload
// in flight, or a job checkpoint still being assembled below a newer
// damaged one (a rollback), is safe. Manifests that cannot be read are
// never deleted. It returns the number of objects deleted.
func Prune(ctx context.Context, st cloud.Store, keep int, log *zap.Logger, pin ...string) (int, error) {
	if keep < 1 {
		return 0, fmt.Errorf("prune: keep must be at least 1, got %d", keep)
	}
	if log == nil {
		log = zap.NewNop()
	}
	p, err := planPrune(ctx, st, keep, pin)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, k := range p.deletions() {
		if err := st.Delete(ctx, k); err != nil {
			return deleted, fmt.Errorf("prune: delete %s: %w", k, err)
		}
		deleted++
	}
	if deleted > 0 {
		log.Info("retention pruned old checkpoints", zap.Int("checkpoints", len(p.drop)), zap.Int("objects", deleted), zap.Int("keep", keep))
	}
	return deleted, nil
}

// prunePlan is what one retention pass found and decided.
type prunePlan struct {
	sizes       map[string]int64 // every object listed under checkpoints/, with its size
	fence       Latest           // latest.json (zero: none)
	pinned      map[string]bool  // manifests kept whatever they are
	kept        map[string]bool  // object keys a kept manifest needs
	keptDir     map[string]bool  // checkpoint prefixes kept
	manifestDir map[string]bool  // checkpoint prefixes with a manifest, readable or not
	drop        []Entry          // manifests to delete, then their objects
	oldestKept  int64            // lowest step kept; -1: none
}

// planPrune lists the store once, reads the manifests (and the pinned ones
// the listing does not show yet) and decides what stays.
func planPrune(ctx context.Context, st cloud.Store, keep int, pin []string) (*prunePlan, error) {
	p := &prunePlan{sizes: map[string]int64{}, pinned: map[string]bool{}, kept: map[string]bool{},
		keptDir: map[string]bool{}, manifestDir: map[string]bool{}, oldestKept: -1}
	var keys []string
	err := st.List(ctx, CheckpointsDir, func(o cloud.ObjectInfo) error {
		p.sizes[o.Key] = o.Size
		if IsManifestKey(o.Key) {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("prune: list checkpoints: %w", err)
	}
	for _, k := range pin {
		p.pinned[k] = true
	}
	if l, err := ReadLatestSealed(ctx, st); err == nil {
		p.fence = l
		if l.Manifest != "" {
			p.pinned[l.Manifest] = true
		}
	} else if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for k := range p.pinned {
		if _, listed := p.sizes[k]; !listed && IsManifestKey(k) {
			keys = append(keys, k) // committed after the listing was taken
		}
	}
	entries, err := readManifests(ctx, st, keys)
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	p.decide(entries, keep)
	return p, nil
}

// decide keeps the pinned manifests and the newest keep restorable ones,
// then the others that are not restorable above the oldest kept; the rest
// are dropped. Unreadable manifests are never dropped.
func (p *prunePlan) decide(entries []Entry, keep int) {
	var later []Entry
	n := 0
	for _, e := range entries {
		p.manifestDir[DirOf(e.Key)] = true
		if e.Err != nil {
			if errors.Is(e.Err, cloud.ErrNotExist) {
				delete(p.manifestDir, DirOf(e.Key)) // gone since the listing
			}
			continue // never delete what we cannot read: a person may want it
		}
		ok := p.restorable(e.Manifest)
		switch {
		case p.pinned[e.Key] || ok && n < keep:
			if ok {
				n++
			}
			p.keep(e)
			if p.oldestKept < 0 || e.Manifest.Step < p.oldestKept {
				p.oldestKept = e.Manifest.Step
			}
		case !ok:
			later = append(later, e) // kept if above the oldest kept
		default:
			p.drop = append(p.drop, e)
		}
	}
	for _, e := range later {
		if p.oldestKept < 0 || e.Manifest.Step > p.oldestKept {
			p.keep(e)
		} else {
			p.drop = append(p.drop, e)
		}
	}
}

// restorable: every object of m listed with its size, and not a fenced
// session's. What restore could pick; only these count toward --keep.
func (p *prunePlan) restorable(m *Manifest) bool {
	if Fenced(m, p.fence) {
		return false
	}
	for _, f := range m.Files {
		if n, ok := p.sizes[f.Key]; !ok || n != f.Size {
			return false
		}
	}
	return true
}

func (p *prunePlan) keep(e Entry) {
	p.keptDir[DirOf(e.Key)] = true
	for _, f := range e.Manifest.Files {
		p.kept[f.Key] = true
	}
}

// deletions is the order of deletes: the dropped manifests first (a
// half-deleted checkpoint is never restorable), then their objects, then
// what no manifest lists below the oldest kept step: the part manifests of
// a job checkpoint that never completed before its data (a node still
// waiting for them then never sees it complete), then the data.
func (p *prunePlan) deletions() []string {
	dropDir := map[string]bool{}
	var out []string
	for _, e := range p.drop {
		dropDir[DirOf(e.Key)] = true
		out = append(out, e.Key)
	}
	var orphanParts, orphanData []string
	for _, k := range slices.Sorted(maps.Keys(p.sizes)) {
		d := DirOf(k)
		if p.kept[k] || p.keptDir[d] || IsManifestKey(k) {
			continue
		}
		s := StepOf(d)
		switch {
		case dropDir[d]:
			out = append(out, k)
		case !p.manifestDir[d] && s >= 0 && p.oldestKept >= 0 && s < p.oldestKept:
			if strings.HasPrefix(k, d+PartsDir) {
				orphanParts = append(orphanParts, k)
			} else {
				orphanData = append(orphanData, k)
			}
		}
	}
	return append(append(out, orphanParts...), orphanData...)
}

// Fenced reports whether restore skips m as a fenced session's under
// latest.json l: committed under an older epoch, above the checkpoint l's
// seal adopted (pkg/checkpoint/restore; the lease, latest.go).
func Fenced(m *Manifest, l Latest) bool {
	ptr := int64(-1)
	if l.Manifest != "" {
		ptr = l.PointsAt()
	}
	return m.Epoch < l.Epoch && m.Step > ptr
}

// IsManifestKey reports whether key is a checkpoint's manifest.
func IsManifestKey(key string) bool {
	d := DirOf(key)
	return d != "" && key == d+ManifestName
}

// DirOf returns "checkpoints/<name>/" for a key below a checkpoint.
func DirOf(key string) string {
	rest, ok := strings.CutPrefix(key, CheckpointsDir)
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	return CheckpointsDir + name + "/"
}

// StepOf parses the step out of "checkpoints/<step:012d>-<id>/", or -1.
func StepOf(dir string) int64 {
	name := strings.TrimSuffix(strings.TrimPrefix(dir, CheckpointsDir), "/")
	digits, _, ok := strings.Cut(name, "-")
	if !ok || len(digits) != 12 {
		return -1
	}
	var s int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return -1
		}
		s = s*10 + int64(c-'0')
	}
	return s
}
