package checkpoint

// The store's side of checkpoints, top to bottom: its single-writer
// objects (small objects put once and read with a limit; latest.json and
// its one writer, one compare-and-swap loop, one retry policy; the
// session's lease, an epoch per session, the seal, the fenced publish,
// that decides who may write it), then the committed checkpoints as a
// listing and retention (below).

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Store objects: the one write-once put and the one bounded read of small
// objects (manifests, latest.json, the journal, part manifests, leases)
// every other file uses.

// PutOnce writes body at key unless the key exists. A retried write whose
// first attempt succeeded reports ErrPrecondition: reading the object back
// tells that case apart from a real clash.
func PutOnce(ctx context.Context, st cloud.Store, key string, body []byte) error {
	err := st.Put(ctx, key, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{IfAbsent: true})
	if !errors.Is(err, cloud.ErrPrecondition) {
		return err
	}
	r, gerr := st.Get(ctx, key, 0, -1)
	if gerr != nil {
		return err
	}
	defer r.Close()
	got, gerr := io.ReadAll(io.LimitReader(r, int64(len(body))+1))
	if gerr == nil && bytes.Equal(got, body) {
		return nil
	}
	return err
}

// ReadJSON reads a small JSON object, refusing anything over limit bytes.
func ReadJSON(ctx context.Context, st cloud.Store, key string, limit int64, v any) error {
	b, err := ReadSmall(ctx, st, key, limit)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w", key, err)
	}
	return nil
}

// ReadSmall reads a whole object, refusing anything over limit bytes: the
// one bounded read of small objects (manifests, journals, summaries).
func ReadSmall(ctx context.Context, st cloud.Store, key string, limit int64) ([]byte, error) {
	r, err := st.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes", key, limit)
	}
	return b, nil
}

// latest.json has one writer, writeLatest: a compare-and-swap on the
// object's version, with one retry policy, used by every commit (single
// node and parts), the lease's seal and its fenced publish.

// latestRetries bounds writeLatest's attempts after lost races.
const latestRetries = 8

// writeLatest reads latest.json with its version and writes what fn makes
// of it, if-version (if-absent when there is none), re-reading and trying
// again when another writer got there first. fn returns false to write
// nothing. With epoch > 0 (a session's lease) a latest.json sealed by a
// newer epoch is ErrFenced; sawEpoch, when set, is told that epoch.
func writeLatest(ctx context.Context, st cloud.Store, epoch int64, sawEpoch func(int64), fn func(cur Latest, exists bool) (Latest, bool)) error {
	for attempt := 0; ; attempt++ {
		cur, version, err := ReadLatestRaw(ctx, st)
		exists := err == nil
		if err != nil && !errors.Is(err, cloud.ErrNotExist) {
			return fmt.Errorf("read latest: %w", err)
		}
		if epoch > 0 && cur.Epoch > epoch {
			if sawEpoch != nil {
				sawEpoch(cur.Epoch)
			}
			return fmt.Errorf("latest.json sealed by epoch %d, this session is %d: %w", cur.Epoch, epoch, ErrFenced)
		}
		next, write := fn(cur, exists)
		if !write {
			return nil
		}
		body, err := json.MarshalIndent(next, "", "  ")
		if err != nil {
			return err
		}
		opts := cloud.PutOptions{IfAbsent: true}
		if exists {
			opts = cloud.PutOptions{IfVersion: version}
		}
		err = st.Put(ctx, LatestKey, bytes.NewReader(body), int64(len(body)), opts)
		if err == nil {
			return nil
		}
		if !errors.Is(err, cloud.ErrPrecondition) || attempt >= latestRetries {
			return fmt.Errorf("write latest: %w", err)
		}
	}
}

// UpdateLatest points latest.json at l unless it already points at a newer
// step: two agents racing cannot lose a commit. Without a lease; see
// Lease.Publish for the fenced write.
func UpdateLatest(ctx context.Context, st cloud.Store, l Latest) error {
	return writeLatest(ctx, st, 0, nil, func(cur Latest, exists bool) (Latest, bool) {
		// The manifest's own step, not the pointer's step field: a pointer
		// whose step disagrees with its manifest gets repaired.
		if exists && cur.Manifest != "" && cur.PointsAt() > l.Step {
			return cur, false
		}
		l.Updated = time.Now().UTC()
		return l, true
	})
}

// ReadLatestRaw reads latest.json and the version it had: stat first, so
// that a write landing between stat and read makes the later if-version
// write fail rather than overwrite something never read. A latest.json
// that does not parse counts as epoch 0 with no pointer.
func ReadLatestRaw(ctx context.Context, st cloud.Store) (Latest, string, error) {
	info, err := st.Stat(ctx, LatestKey)
	if err != nil {
		return Latest{}, "", err
	}
	var cur Latest
	if err := ReadJSON(ctx, st, LatestKey, 1<<20, &cur); err != nil {
		if errors.Is(err, cloud.ErrNotExist) {
			return Latest{}, "", err
		}
		if ctx.Err() != nil {
			return Latest{}, "", ctx.Err()
		}
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if !errors.As(err, &syn) && !errors.As(err, &typ) {
			return Latest{}, "", err
		}
		cur = Latest{}
	}
	return cur, info.Version, nil
}

// ReadLatest reads and parses latest.json.
func ReadLatest(ctx context.Context, st cloud.Store) (Latest, error) {
	l, err := ReadLatestSealed(ctx, st)
	if err == nil && l.Manifest == "" { // sealed by a lease before any commit (the lease, below)
		return Latest{}, fmt.Errorf("latest: no checkpoint yet: %w", cloud.ErrNotExist)
	}
	return l, err
}

// ReadLatestSealed is ReadLatest that also returns a latest.json a lease sealed
// without a pointer (Manifest ""): its epoch still fences older sessions.
func ReadLatestSealed(ctx context.Context, st cloud.Store) (Latest, error) {
	var l Latest
	if err := ReadJSON(ctx, st, LatestKey, 1<<20, &l); err != nil {
		return Latest{}, err
	}
	if l.Manifest == "" && l.Epoch > 0 {
		return l, nil
	}
	if err := SafeRel(l.Manifest); err != nil {
		return Latest{}, fmt.Errorf("latest: %w", err)
	}
	return l, nil
}

// ErrFenced means a newer session took the run over: this one may upload
// checkpoints but never moves latest.json or the journal again.
var ErrFenced = errors.New("fenced: a newer session owns the run")

// LeaseDir holds one object per session: leases/<epoch:012d>.json. In a
// multi-node job each node has its own: leases/<node>/<epoch:012d>.json.
const LeaseDir = "leases/"

// LeaseRecord is the content of leases/<epoch>.json.
type LeaseRecord struct {
	Epoch    int64     `json:"epoch"`
	Session  string    `json:"session"`
	Instance Machine   `json:"instance"`
	Started  time.Time `json:"started"`
}

// Lease is one session's claim on a run. Sessions are ordered by epoch:
// the highest epoch in leases/ owns the run, and every older session is
// fenced. A Lease is safe for concurrent use.
type Lease struct {
	LeaseRecord
	st    cloud.Store
	dir   string       // LeaseDir, or LeaseDir+node+"/" for a part lease
	newer atomic.Int64 // highest newer epoch seen; 0: none
}

// leaseKey names the lease object of epoch in dir.
func leaseKey(dir string, epoch int64) string { return fmt.Sprintf("%s%012d.json", dir, epoch) }

// AcquireLease takes the next epoch (the highest existing one plus one,
// written if-absent: of two sessions racing for an epoch, one gets it and
// the other tries the next) and then seals latest.json with it, so that no
// older session can move latest.json any more. Restore after AcquireLease.
// ErrFenced means an even newer session sealed first.
func AcquireLease(ctx context.Context, st cloud.Store, rec LeaseRecord) (*Lease, error) {
	top, err := highestEpoch(ctx, st, LeaseDir)
	if err != nil {
		return nil, err
	}
	if cur, _, err := ReadLatestRaw(ctx, st); err == nil && cur.Epoch > top {
		top = cur.Epoch // leases/ lost or trimmed by hand: never reuse an epoch
	}
	l := &Lease{st: st, dir: LeaseDir}
	if err := l.take(ctx, rec, top); err != nil {
		return nil, err
	}
	if err := l.seal(ctx); err != nil {
		return l, err
	}
	l.prune(ctx)
	return l, nil
}

// LeasesKept is how many of the newest lease objects prune keeps: fencing
// needs only the newest (an older session is fenced by any higher epoch,
// and latest.json's epoch keeps epochs from being reused); the rest say
// who ran the run lately.
const LeasesKept = 8

// prune deletes the lease objects more than LeasesKept epochs below this
// one, best effort: without it leases/ grows by one object per session.
func (l *Lease) prune(ctx context.Context) {
	var old []string
	l.st.List(ctx, l.dir, func(o cloud.ObjectInfo) error {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, l.dir), ".json")
		if e, err := strconv.ParseInt(name, 10, 64); ok && err == nil && e <= l.Epoch-LeasesKept {
			old = append(old, o.Key)
		}
		return nil
	})
	for _, k := range old {
		l.st.Delete(ctx, k)
	}
}

// AcquirePartLease takes the next epoch of node's own leases
// (leases/<node>/), for one node of a multi-node job: the nodes share
// latest.json, so a part lease seals nothing. It fences a second live copy
// of the same node (a spot replacement started while the old machine still
// runs): the older copy's parts stop being written once Check sees the
// newer epoch (Committer.PartLease).
func AcquirePartLease(ctx context.Context, st cloud.Store, node string, rec LeaseRecord) (*Lease, error) {
	if !validNode(node) {
		return nil, fmt.Errorf("lease: bad part name %q", node)
	}
	dir := LeaseDir + node + "/"
	top, err := highestEpoch(ctx, st, dir)
	if err != nil {
		return nil, err
	}
	l := &Lease{st: st, dir: dir}
	if err := l.take(ctx, rec, top); err != nil {
		return nil, err
	}
	l.prune(ctx)
	return l, nil
}

// take writes rec with the first free epoch above top (if-absent: of two
// sessions racing for an epoch, one gets it and the other tries the next).
func (l *Lease) take(ctx context.Context, rec LeaseRecord, top int64) error {
	for attempt := 0; ; attempt++ {
		rec.Epoch = top + 1
		body, err := json.MarshalIndent(rec, "", "  ")
		if err != nil {
			return err
		}
		err = l.st.Put(ctx, leaseKey(l.dir, rec.Epoch), bytes.NewReader(body), int64(len(body)), cloud.PutOptions{IfAbsent: true})
		if err == nil {
			l.LeaseRecord = rec
			return nil
		}
		if !errors.Is(err, cloud.ErrPrecondition) || attempt >= 16 {
			return fmt.Errorf("lease: %w", err)
		}
		top = rec.Epoch
	}
}

// highestEpoch is the highest epoch in dir (0: none). Only dir's own
// objects count: leases/ holds the part leases' folders too.
func highestEpoch(ctx context.Context, st cloud.Store, dir string) (int64, error) {
	var top int64
	err := st.List(ctx, dir, func(o cloud.ObjectInfo) error {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, dir), ".json")
		if e, err := strconv.ParseInt(name, 10, 64); ok && err == nil && e > top {
			top = e
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("list leases: %w", err)
	}
	return top, nil
}

// seal rewrites latest.json with this lease's epoch. It also moves the
// pointer to the newest checkpoint committed before the seal that
// latest.json does not name yet (a commit whose latest.json write never
// landed: the machine died between the two): listed just before each
// attempt of the write, so that every checkpoint the older sessions
// committed until then stays restorable. From the seal on, a checkpoint of
// an older epoch above the pointer is a fenced session's (restore skips
// it; docs/reliability.md). With no checkpoint at all, the seal writes a
// pointer-less latest.json.
func (l *Lease) seal(ctx context.Context) error {
	var listErr error
	err := writeLatest(ctx, l.st, l.Epoch, l.sawEpoch, func(cur Latest, exists bool) (Latest, bool) {
		adopt, err := newestUnpublished(ctx, l.st, cur)
		if err != nil {
			listErr = err
			return cur, false
		}
		if adopt != nil {
			cur.Manifest, cur.Step, cur.ID = adopt.Manifest, adopt.Step, adopt.ID
		}
		cur.Epoch = l.Epoch
		cur.Updated = time.Now().UTC()
		return cur, true
	})
	if listErr != nil {
		return fmt.Errorf("seal: %w", listErr)
	}
	return err
}

// newestUnpublished returns a pointer to the newest readable manifest with
// a higher step than the one cur points at (any, when cur points at none)
// committed under cur's epoch or a newer one; nil when there is none. A
// manifest of an older epoch than cur's was committed after that epoch's
// seal: a fenced session's, never adopted.
func newestUnpublished(ctx context.Context, st cloud.Store, cur Latest) (*Latest, error) {
	keys, err := ListManifestKeys(ctx, st)
	if err != nil {
		return nil, err
	}
	floor := int64(-1)
	if cur.Manifest != "" {
		floor = cur.PointsAt()
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return StepOf(DirOf(k)) <= floor })
	slices.SortFunc(keys, func(a, b string) int {
		if sa, sb := StepOf(DirOf(a)), StepOf(DirOf(b)); sa != sb {
			return cmp.Compare(sb, sa)
		}
		return strings.Compare(b, a)
	})
	for _, k := range keys {
		m, err := ReadManifest(ctx, st, k)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch {
		case errors.Is(err, cloud.ErrNotExist) || isBadManifest(err):
			continue // deleted since the listing, or broken: restore skips it too
		case err != nil:
			return nil, err // adopting none would fence a committed checkpoint
		case m.Epoch < cur.Epoch:
			continue // fenced by an earlier seal
		}
		return &Latest{Manifest: k, Step: m.Step, ID: m.ID}, nil
	}
	return nil, nil
}

// Publish points latest.json at next unless this session is fenced (a
// newer lease exists, or latest.json carries a newer epoch: ErrFenced) or
// latest.json already names a newer step of this epoch (nothing to do).
// The write is a compare-and-swap on the version read with the epoch, so
// a newer session's seal landing in between makes it re-check and fail.
func (l *Lease) Publish(ctx context.Context, next Latest) error {
	if err := l.Check(ctx); err != nil {
		return err
	}
	next.Epoch = l.Epoch
	return writeLatest(ctx, l.st, l.Epoch, l.sawEpoch, func(cur Latest, exists bool) (Latest, bool) {
		if exists && cur.Epoch == l.Epoch && cur.Manifest != "" && cur.PointsAt() > next.Step {
			return cur, false
		}
		next.Updated = time.Now().UTC()
		return next, true
	})
}

// Check lists leases/ (one List) and reports ErrFenced once a newer epoch
// exists. Once fenced, a session stays fenced without asking the store.
func (l *Lease) Check(ctx context.Context) error {
	if l.Fenced() {
		return l.fencedErr()
	}
	top, err := highestEpoch(ctx, l.st, l.dir)
	if err != nil {
		return err
	}
	if top > l.Epoch {
		l.sawEpoch(top)
		return l.fencedErr()
	}
	return nil
}

// Fenced reports whether a newer session was seen.
func (l *Lease) Fenced() bool { return l != nil && l.newer.Load() > 0 }

// FencedBy is the newest epoch seen above this one (0: not fenced).
func (l *Lease) FencedBy() int64 { return l.newer.Load() }

func (l *Lease) sawEpoch(e int64) {
	for {
		old := l.newer.Load()
		if e <= old || l.newer.CompareAndSwap(old, e) {
			return
		}
	}
}

func (l *Lease) fencedErr() error {
	return fmt.Errorf("epoch %d exists, this session is %d: %w", l.newer.Load(), l.Epoch, ErrFenced)
}

// The store's committed checkpoints as a listing: manifests read and
// decoded (a damaged one named), listed newest first, incomplete uploads
// found; retention (which checkpoints are pruned, which kept) and the keys'
// layout (a manifest's key, its directory, its step).

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
