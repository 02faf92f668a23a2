package checkpoint

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Prune keeps the newest keep complete checkpoints (and always the one
// latest.json names, and the manifests named in pin: say, the checkpoint
// just committed, whatever its step) and deletes the others. Each checkpoint loses its
// manifest first, so a half-deleted checkpoint is never restorable; then
// every object that no kept manifest lists goes. Objects without a manifest
// (an upload a crash cut short) are removed only when they are older by
// step than the oldest kept checkpoint, so an upload in flight is safe.
// It returns the number of objects deleted.
func Prune(ctx context.Context, st cloud.Store, keep int, log *zap.Logger, pin ...string) (int, error) {
	if keep < 1 {
		return 0, fmt.Errorf("prune: keep must be at least 1, got %d", keep)
	}
	if log == nil {
		log = zap.NewNop()
	}
	entries, err := ListManifests(ctx, st)
	if err != nil {
		return 0, fmt.Errorf("prune: %w", err)
	}
	pinned := map[string]bool{}
	for _, k := range pin {
		pinned[k] = true
	}
	if l, err := ReadLatest(ctx, st); err == nil {
		pinned[l.Manifest] = true
	}
	kept := map[string]bool{}        // object keys a kept manifest needs
	keptDir := map[string]bool{}     // checkpoint prefixes kept
	dropDir := map[string]bool{}     // checkpoint prefixes whose manifest goes
	manifestDir := map[string]bool{} // checkpoint prefixes with a manifest, readable or not
	var drop []Entry
	n := 0
	oldestKept := int64(-1)
	for _, e := range entries {
		manifestDir[dirOf(e.Key)] = true
		if e.Err != nil {
			continue // never delete what we cannot read: a person may want it
		}
		if n < keep || pinned[e.Key] {
			n++
			keptDir[dirOf(e.Key)] = true
			for _, f := range e.Manifest.Files {
				kept[f.Key] = true
			}
			if oldestKept < 0 || e.Manifest.Step < oldestKept {
				oldestKept = e.Manifest.Step
			}
			continue
		}
		drop = append(drop, e)
		dropDir[dirOf(e.Key)] = true
	}
	deleted := 0
	for _, e := range drop {
		if err := st.Delete(ctx, e.Key); err != nil {
			return deleted, fmt.Errorf("prune: delete %s: %w", e.Key, err)
		}
		deleted++
	}
	var victims []string
	err = st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		d := dirOf(o.Key)
		if kept[o.Key] || keptDir[d] {
			return nil
		}
		// An object of a dropped checkpoint, or one a crash left (no manifest)
		// older than every kept checkpoint.
		if s := stepOf(d); dropDir[d] || (oldestKept >= 0 && !manifestDir[d] && s >= 0 && s < oldestKept) {
			victims = append(victims, o.Key)
		}
		return nil
	})
	if err != nil {
		return deleted, fmt.Errorf("prune: %w", err)
	}
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
