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
	// One listing: the manifests, and every object with its size.
	sizes := map[string]int64{}
	var keys []string
	err := st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		sizes[o.Key] = o.Size
		if isManifestKey(o.Key) {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune: list checkpoints: %w", err)
	}
	pinned := map[string]bool{}
	for _, k := range pin {
		pinned[k] = true
	}
	var fence Latest
	if l, err := readLatest(ctx, st); err == nil {
		fence = l
		if l.Manifest != "" {
			pinned[l.Manifest] = true
		}
	} else if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	for k := range pinned {
		if _, listed := sizes[k]; !listed && isManifestKey(k) {
			keys = append(keys, k) // committed after the listing was taken
		}
	}
	entries, err := readManifests(ctx, st, keys)
	if err != nil {
		return 0, fmt.Errorf("prune: %w", err)
	}
	restorable := func(m *Manifest) bool {
		if fenced(m, fence) {
			return false
		}
		for _, f := range m.Files {
			if n, ok := sizes[f.Key]; !ok || n != f.Size {
				return false
			}
		}
		return true
	}
	kept := map[string]bool{}        // object keys a kept manifest needs
	keptDir := map[string]bool{}     // checkpoint prefixes kept
	dropDir := map[string]bool{}     // checkpoint prefixes whose manifest goes
	manifestDir := map[string]bool{} // checkpoint prefixes with a manifest, readable or not
	var drop, later []Entry
	n := 0
	oldestKept := int64(-1)
	keepEntry := func(e Entry) {
		keptDir[dirOf(e.Key)] = true
		for _, f := range e.Manifest.Files {
			kept[f.Key] = true
		}
	}
	for _, e := range entries {
		manifestDir[dirOf(e.Key)] = true
		if e.Err != nil {
			if errors.Is(e.Err, cloud.ErrNotExist) {
				delete(manifestDir, dirOf(e.Key)) // gone since the listing
			}
			continue // never delete what we cannot read: a person may want it
		}
		ok := restorable(e.Manifest)
		switch {
		case pinned[e.Key] || ok && n < keep:
			if ok {
				n++
			}
			keepEntry(e)
			if oldestKept < 0 || e.Manifest.Step < oldestKept {
				oldestKept = e.Manifest.Step
			}
		case !ok:
			later = append(later, e) // kept if above the oldest kept
		default:
			drop = append(drop, e)
		}
	}
	for _, e := range later {
		if oldestKept < 0 || e.Manifest.Step > oldestKept {
			keepEntry(e)
		} else {
			drop = append(drop, e)
		}
	}
	for _, e := range drop {
		dropDir[dirOf(e.Key)] = true
	}
	deleted := 0
	for _, e := range drop {
		if err := st.Delete(ctx, e.Key); err != nil {
			return deleted, fmt.Errorf("prune: delete %s: %w", e.Key, err)
		}
		deleted++
	}
	// The part manifests of a job checkpoint that never completed go
	// before its data: a node still waiting for them then never sees it
	// complete.
	var victims, orphanParts, orphanData []string
	for _, k := range slices.Sorted(maps.Keys(sizes)) {
		d := dirOf(k)
		if kept[k] || keptDir[d] || isManifestKey(k) {
			continue
		}
		s := stepOf(d)
		switch {
		case dropDir[d]:
			victims = append(victims, k)
		case !manifestDir[d] && s >= 0 && oldestKept >= 0 && s < oldestKept:
			if strings.HasPrefix(k, d+partsDir) {
				orphanParts = append(orphanParts, k)
			} else {
				orphanData = append(orphanData, k)
			}
		}
	}
	victims = append(append(victims, orphanParts...), orphanData...)
	for _, k := range victims {
		if err := st.Delete(ctx, k); err != nil {
			return deleted, fmt.Errorf("prune: delete %s: %w", k, err)
		}
		deleted++
	}
	if deleted > 0 {
		log.Info("retention pruned old checkpoints", zap.Int("checkpoints", len(drop)), zap.Int("objects", deleted), zap.Int("keep", keep))
	}
	return deleted, nil
}

// fenced reports whether restore skips m as a fenced session's under
// latest.json l: committed under an older epoch, above the checkpoint l's
// seal adopted (restore.go, lease.go).
func fenced(m *Manifest, l Latest) bool {
	ptr := int64(-1)
	if l.Manifest != "" {
		ptr = l.PointsAt()
	}
	return m.Epoch < l.Epoch && m.Step > ptr
}

// isManifestKey reports whether key is a checkpoint's manifest.
func isManifestKey(key string) bool {
	d := dirOf(key)
	return d != "" && key == d+manifestObj
}

// dirOf returns "checkpoints/<name>/" for a key below a checkpoint.
func dirOf(key string) string {
	rest, ok := strings.CutPrefix(key, prefixDir)
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	return prefixDir + name + "/"
}

// stepOf parses the step out of "checkpoints/<step:012d>-<id>/", or -1.
func stepOf(dir string) int64 {
	name := strings.TrimSuffix(strings.TrimPrefix(dir, prefixDir), "/")
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
