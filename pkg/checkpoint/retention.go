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
// Parts of a job checkpoint that never got its manifest (parts/ but no
// manifest.json) go once a newer checkpoint is committed: the job moved on
// without it. Nothing above the newest committed step is ever deleted:
// other nodes may still be assembling it. It returns the number of
// objects deleted.
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
	oldestKept, newest := int64(-1), int64(-1)
	for _, e := range entries {
		manifestDir[dirOf(e.Key)] = true
		if e.Err != nil {
			continue // never delete what we cannot read: a person may want it
		}
		newest = max(newest, e.Manifest.Step)
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
	var victims, partsOnly []string
	hasParts := map[string]bool{} // prefixes with parts/ and no manifest
	err = st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		d := dirOf(o.Key)
		if kept[o.Key] || keptDir[d] {
			return nil
		}
		s := stepOf(d)
		switch {
		case dropDir[d] || (oldestKept >= 0 && !manifestDir[d] && s >= 0 && s < oldestKept):
			// An object of a dropped checkpoint, or one a crash left (no
			// manifest) older than every kept checkpoint.
			victims = append(victims, o.Key)
		case !manifestDir[d] && s >= 0 && s < newest:
			// Perhaps part of a job checkpoint that never completed.
			partsOnly = append(partsOnly, o.Key)
			if strings.HasPrefix(o.Key, d+partsDir) {
				hasParts[d] = true
			}
		}
		return nil
	})
	if err != nil {
		return deleted, fmt.Errorf("prune: %w", err)
	}
	// The part manifests first: a node still waiting for them then never
	// sees the checkpoint complete.
	for _, first := range []bool{true, false} {
		for _, k := range partsOnly {
			if d := dirOf(k); hasParts[d] && strings.HasPrefix(k, d+partsDir) == first {
				victims = append(victims, k)
			}
		}
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
