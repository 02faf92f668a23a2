package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

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
// seal adopted (pkg/checkpoint/restore, lease.go).
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
