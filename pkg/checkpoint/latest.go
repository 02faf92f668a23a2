package checkpoint

// The store's single-writer objects: small objects put once and read with a
// limit; latest.json and its one writer (one compare-and-swap loop, one
// retry policy); the session's lease (an epoch per session, the seal, the
// fenced publish) that decides who may write it.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
