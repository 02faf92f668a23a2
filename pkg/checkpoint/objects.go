package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
