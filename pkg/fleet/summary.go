package fleet

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// summaryFormat names the summary schema; summaryFormatV1 is the one
// agents rewrote at the fleet root before session records (legacyKey).
const (
	summaryFormat   = "spotagent.fleet/v2"
	summaryFormatV1 = "spotagent.fleet/v1"
)

// maxSummary bounds what is read as a summary: 100,000 runs take ~100 MB.
const maxSummary = 1 << 30

// ioWorkers bounds the records read or deleted at once (a variable for
// the simulation, sim_test.go, which needs one store call at a time).
var ioWorkers = 32

// Summary is every run's Run, keyed by the run's directory under the fleet
// root. The one at fleet/summary.gob is written only by a compaction
// (compact), never by an agent.
type Summary struct {
	Format  string    `json:"format"`
	Updated time.Time `json:"updated"`
	// Baseline is when a recount last filled the summary with every run
	// under the root. Zero: it holds only the runs agents recorded, so
	// Load recounts.
	Baseline time.Time `json:"baseline,omitzero"`
	// Generation counts the compactions that wrote it.
	Generation int64 `json:"generation,omitempty"`
	// Legacy is the version of the v1 summary at the root (legacyKey) that
	// is merged in: a new version (an agent not yet upgraded) is merged again.
	Legacy string          `json:"legacy_version,omitempty"`
	Runs   map[string]*Run `json:"runs"`
}

// put keeps the run's entry unless the summary holds one computed from a
// fuller journal (another agent of the same job, a later session).
func (s *Summary) put(r *Run) {
	if cur, ok := s.Runs[r.Dir]; ok && cur.Entries > r.Entries {
		return
	}
	s.Runs[r.Dir] = r
}

// state is the fleet as one read found it: the last compaction's summary,
// the session records written since and the v1 summary if any.
type state struct {
	snap        *Summary // nil when none (or damaged: snapErr)
	snapVersion string   // "" when none
	snapErr     error    // the summary does not parse
	records     []string // the records merged into merged
	badRecords  []Damaged
	legacy      string // version of the v1 summary merged ("" none or already in snap)
	merged      *Summary
}

// ReadSummary reads the fleet at the root of st as it stands: the last
// compaction's summary with every session record since (and a v1 summary
// left by older agents) merged. A fleet with none of them is
// cloud.ErrNotExist.
func ReadSummary(ctx context.Context, st cloud.Store) (*Summary, error) {
	s, err := readState(ctx, st)
	if err != nil {
		return nil, err
	}
	if s.snapErr != nil {
		return nil, s.snapErr
	}
	if s.snap == nil && len(s.records) == 0 && s.legacy == "" {
		return nil, fmt.Errorf("fleet summary: %w", cloud.ErrNotExist)
	}
	return s.merged, nil
}

// readState reads the summary, lists and reads the records, and checks
// that the summary did not change meanwhile: a compaction writes it before
// it deletes the records it took in, so an unchanged summary means no
// record was missed. It tries again when it did change.
func readState(ctx context.Context, st cloud.Store) (*state, error) {
	var err error
	for range 5 {
		var s *state
		if s, err = readOnce(ctx, st); err == nil {
			return s, nil
		}
		if !errors.Is(err, errMoved) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("fleet summary: compacted under every read: %w", err)
}

var errMoved = errors.New("the fleet summary changed while it was read")

func readOnce(ctx context.Context, st cloud.Store) (*state, error) {
	s := &state{}
	var err error
	s.snap, s.snapVersion, err = readSummaryAt(ctx, st, snapshotKey)
	switch {
	case errors.Is(err, cloud.ErrNotExist):
	case err != nil && s.snapVersion != "":
		s.snap, s.snapErr = nil, err
	case err != nil:
		return nil, err
	}
	var keys []string
	err = st.List(ctx, recordsPrefix, func(o cloud.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list fleet records: %w", err)
	}
	runs := make([]*Run, len(keys))
	bad := make([]error, len(keys))
	err = forEach(ctx, len(keys), func(i int) error {
		var err error
		runs[i], bad[i], err = readRecord(ctx, st, keys[i])
		if errors.Is(err, cloud.ErrNotExist) {
			return errMoved // deleted by a compaction: read the summary again
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if v, err := versionOf(ctx, st, snapshotKey); err != nil {
		return nil, err
	} else if v != s.snapVersion {
		return nil, errMoved
	}
	s.merged = &Summary{Format: summaryFormat, Runs: map[string]*Run{}}
	if s.snap != nil {
		s.merged.Updated, s.merged.Baseline = s.snap.Updated, s.snap.Baseline
		s.merged.Generation, s.merged.Legacy = s.snap.Generation, s.snap.Legacy
		maps.Copy(s.merged.Runs, s.snap.Runs)
	}
	// The v1 summary older agents rewrite at the root: merged while its
	// version is new to the summary (before the records: it is older).
	if err := s.mergeLegacy(ctx, st); err != nil {
		return nil, err
	}
	for i, k := range keys {
		if bad[i] != nil {
			s.badRecords = append(s.badRecords, Damaged{Key: k, Problems: []string{bad[i].Error()}})
			continue
		}
		s.records = append(s.records, k)
		s.merged.put(runs[i])
	}
	return s, nil
}

func (s *state) mergeLegacy(ctx context.Context, st cloud.Store) error {
	lv, err := versionOf(ctx, st, legacyKey)
	if err != nil || lv == "" || lv == s.merged.Legacy {
		return err
	}
	old, _, err := readSummaryAt(ctx, st, legacyKey)
	if errors.Is(err, cloud.ErrNotExist) {
		return nil
	}
	if err != nil {
		s.badRecords = append(s.badRecords, Damaged{Key: legacyKey, Problems: []string{err.Error()}})
		return nil
	}
	for _, r := range old.Runs {
		s.merged.put(r)
	}
	s.legacy = lv
	return nil
}

func versionOf(ctx context.Context, st cloud.Store, key string) (string, error) {
	info, err := st.Stat(ctx, key)
	if errors.Is(err, cloud.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("fleet summary: %w", err)
	}
	return info.Version, nil
}

// readSummaryAt reads a summary; a damaged one is an error with its
// version (what a compaction may replace).
func readSummaryAt(ctx context.Context, st cloud.Store, key string) (*Summary, string, error) {
	info, err := st.Stat(ctx, key)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	b, err := checkpoint.ReadSmall(ctx, st, key, maxSummary)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	s := &Summary{}
	if strings.HasSuffix(key, ".gob") {
		err = gob.NewDecoder(bytes.NewReader(b)).Decode(s)
	} else {
		err = json.Unmarshal(b, s)
	}
	if err != nil {
		return nil, info.Version, fmt.Errorf("parse fleet summary %s: %w", key, err)
	}
	if s.Format != summaryFormat && s.Format != summaryFormatV1 {
		return nil, info.Version, fmt.Errorf("fleet summary %s: format %q: want %s", key, s.Format, summaryFormat)
	}
	if s.Runs == nil {
		s.Runs = map[string]*Run{}
	}
	for dir, r := range s.Runs {
		if r == nil {
			delete(s.Runs, dir)
		} else {
			r.Dir = dir
		}
	}
	return s, info.Version, nil
}

// readRecord reads a session record: damage says why it is not one (a
// compaction deletes it), err why it could not be read (nothing is
// deleted: the next read tries again).
func readRecord(ctx context.Context, st cloud.Store, key string) (r *Run, damage, err error) {
	if _, ok := parseRecordName(key); !ok {
		return nil, errors.New("not a fleet record name"), nil
	}
	b, err := checkpoint.ReadSmall(ctx, st, key, maxRecord)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet record: %w", err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("parse fleet record: %w", err), nil
	}
	if rec.Format != recordFormat || rec.Run == nil {
		return nil, fmt.Errorf("fleet record: format %q: want %s", rec.Format, recordFormat), nil
	}
	return rec.Run, nil, nil
}

// forEach runs fn(0..n-1) on ioWorkers goroutines and returns the first
// error; the rest still run to their end.
func forEach(ctx context.Context, n int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range min(ioWorkers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// errCompacted: another compaction wrote the summary first; its result
// holds everything this one read, or the next one takes it in.
var errCompacted = errors.New("another compaction wrote the fleet summary first")

// compact writes next, the fleet as s read it (with a recount merged in
// when there was one), as the new summary with a compare-and-swap on the
// version s read; then every instance type's prior sums; then deletes the
// records s merged. Agents never wait for it and it never loses a record:
// a record written after the listing is not deleted, and one read before
// is in the summary before it goes. A compaction that loses the race does
// nothing more (errCompacted).
func compact(ctx context.Context, st cloud.Store, s *state, next *Summary) error {
	next.Format, next.Updated = summaryFormat, time.Now().UTC()
	if s.snap != nil {
		next.Generation = s.snap.Generation + 1
	} else {
		next.Generation = 1
	}
	if s.legacy != "" {
		next.Legacy = s.legacy
	}
	// gob, not JSON: 100,000 runs are 30 MB instead of 100 and decode
	// eight times faster (bench section 9b).
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(next); err != nil {
		return err
	}
	body := buf.Bytes()
	opts := cloud.PutOptions{IfVersion: s.snapVersion}
	if s.snapVersion == "" {
		opts = cloud.PutOptions{IfAbsent: true}
	}
	if err := st.Put(ctx, snapshotKey, bytes.NewReader(body), int64(len(body)), opts); err != nil {
		if errors.Is(err, cloud.ErrPrecondition) {
			return errCompacted
		}
		return fmt.Errorf("write fleet summary: %w", err)
	}
	if err := writePriors(ctx, st, next); err != nil {
		return err
	}
	gone := append(slicesOfKeys(s.badRecords), s.records...)
	return forEach(ctx, len(gone), func(i int) error {
		if err := st.Delete(ctx, gone[i]); err != nil && !errors.Is(err, cloud.ErrNotExist) {
			return fmt.Errorf("delete compacted fleet record: %w", err)
		}
		return nil
	})
}

func slicesOfKeys(ds []Damaged) []string {
	var keys []string
	for _, d := range ds {
		if d.Key != legacyKey {
			keys = append(keys, d.Key)
		}
	}
	return keys
}

// writePriors writes each instance type's per-zone sums over the runs of
// s, unless a later compaction already wrote newer ones.
func writePriors(ctx context.Context, st cloud.Store, s *Summary) error {
	type ct struct{ cloud, typ string }
	sums := map[ct]*poolSums{}
	for _, r := range s.Runs {
		for i := range r.Cells {
			c := &r.Cells[i]
			if c.InstanceType == "" {
				continue
			}
			p := sums[ct{c.Cloud, c.InstanceType}]
			if p == nil {
				p = &poolSums{Format: priorFormat, Generation: s.Generation, Zones: map[string]Tally{}}
				sums[ct{c.Cloud, c.InstanceType}] = p
			}
			t := p.Zones[c.Zone]
			t.add(Tally{Machine: c.Machine, Interruptions: c.Interruptions, NoticeCommits: c.NoticeCommits})
			p.Zones[c.Zone] = t
		}
	}
	keys := make([]ct, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	return forEach(ctx, len(keys), func(i int) error {
		k := keys[i]
		key := priorKey(k.cloud, k.typ)
		if b, err := checkpoint.ReadSmall(ctx, st, key, 1<<20); err == nil {
			var cur poolSums
			if json.Unmarshal(b, &cur) == nil && cur.Generation > s.Generation {
				return nil
			}
		}
		body, err := json.Marshal(sums[k])
		if err != nil {
			return err
		}
		if err := st.Put(ctx, key, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{}); err != nil {
			return fmt.Errorf("write fleet prior: %w", err)
		}
		return nil
	})
}
