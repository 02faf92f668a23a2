package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

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
	if err == nil && l.Manifest == "" { // sealed by a lease before any commit (lease.go)
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
