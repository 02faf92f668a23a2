package liveness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Store keys under the run's store.
const (
	dir      = "liveness/"
	tokenKey = dir + "token"
)

// recordKey is where node's record is.
func recordKey(node int) string { return dir + "node-" + strconv.Itoa(node) + ".json" }

// record is liveness/node-<k>.json: where node k's agent listens.
type record struct {
	Node    int      `json:"node"`
	Session string   `json:"session"`
	Started int64    `json:"started_unix_nano"`
	Addrs   []string `json:"addrs"`
}

// Token returns the job's secret (liveness/token), creating it if absent:
// whichever agent writes first wins, the others read what it wrote. Only
// the job's store credentials can read it: the heartbeats' HMAC key, and
// the peer tier's (pkg/checkpoint/peertier).
func Token(ctx context.Context, st cloud.Store) ([]byte, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	tok := []byte(hex.EncodeToString(raw))
	err := st.Put(ctx, tokenKey, bytes.NewReader(tok), int64(len(tok)), cloud.PutOptions{IfAbsent: true})
	if err == nil {
		return tok, nil
	}
	if !errors.Is(err, cloud.ErrPrecondition) {
		return nil, fmt.Errorf("create %s: %w", tokenKey, err)
	}
	b, err := readAll(ctx, st, tokenKey)
	if err != nil {
		return nil, err
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("%s: %d bytes, want at least 32", tokenKey, len(b))
	}
	return b, nil
}

// getRecord reads node's record; nil when it has none yet.
func getRecord(ctx context.Context, st cloud.Store, node int) (*record, error) {
	b, err := readAll(ctx, st, recordKey(node))
	if errors.Is(err, cloud.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", recordKey(node), err)
	}
	return &r, nil
}

func putJSON(ctx context.Context, st cloud.Store, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, key, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// readAll reads a small object (at most 64 KiB).
func readAll(ctx context.Context, st cloud.Store, key string) ([]byte, error) {
	rc, err := st.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return b, nil
}
