package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spotagent/spotagent/pkg/cloud"
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
