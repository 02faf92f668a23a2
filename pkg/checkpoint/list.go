package checkpoint

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// maxManifest bounds what is read as a manifest: a checkpoint of 100,000
// files fits well inside it.
const maxManifest = 64 << 20

// Entry is one manifest found in a store. Err is set when it could not be
// read or does not validate; such an entry is never restored from.
type Entry struct {
	Key      string
	Manifest *Manifest
	Err      error
}

// ReadManifest reads and validates one manifest.
func ReadManifest(ctx context.Context, st cloud.Store, key string) (*Manifest, error) {
	var m Manifest
	if err := readJSON(ctx, st, key, maxManifest, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", key, err)
	}
	if want := ManifestKey(m.Step, m.ID); want != key {
		return nil, fmt.Errorf("manifest %s: names step %d id %s, which belong at %s", key, m.Step, m.ID, want)
	}
	return &m, nil
}

// ListManifests returns every manifest under checkpoints/, newest first
// (highest step, then latest created). Unreadable manifests are included
// with Err set so that callers can report them.
func ListManifests(ctx context.Context, st cloud.Store) ([]Entry, error) {
	keys, err := listManifestKeys(ctx, st)
	if err != nil {
		return nil, err
	}
	return readManifests(ctx, st, keys)
}

// listManifestKeys lists the keys of every manifest under checkpoints/
// without reading them.
func listManifestKeys(ctx context.Context, st cloud.Store) ([]string, error) {
	var keys []string
	err := st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		rest := strings.TrimPrefix(o.Key, prefixDir)
		if dir, name, ok := strings.Cut(rest, "/"); ok && dir != "" && name == manifestObj {
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
	sort.SliceStable(entries, func(i, j int) bool { return newer(entries[i], entries[j]) })
	return entries, nil
}

// newer orders entries newest first; broken ones last, by key.
func newer(a, b Entry) bool {
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
	err := st.List(ctx, prefixDir, func(o cloud.ObjectInfo) error {
		d := dirOf(o.Key)
		switch rest := strings.TrimPrefix(o.Key, d); {
		case rest == manifestObj:
			hasManifest[d] = true
		case strings.HasPrefix(rest, partsDir) && strings.HasSuffix(rest, ".json"):
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
		in := Incomplete{Step: stepOf(d)}
		_, in.ID, _ = strings.Cut(strings.TrimSuffix(strings.TrimPrefix(d, prefixDir), "/"), "-")
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
