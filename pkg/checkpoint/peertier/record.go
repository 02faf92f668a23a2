package peertier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Record is peers/<node>.json: where a node's peer server listens and
// which checkpoints its local tier holds (this node's part of each).
// Rewritten at each start and after each copy the tier keeps; a stale one
// (a node gone, an earlier start's port) costs a refused connection, then
// the store.
type Record struct {
	Node    string   `json:"node"`
	Session string   `json:"session"`
	Addrs   []string `json:"addrs"`
	Holds   []string `json:"holds"`
	// Replicas > 0: the node also keeps a copy of another node's part
	// (placement.go) of the checkpoints it holds (--replicas).
	Replicas int `json:"replicas,omitempty"`
	// Machine is where the node runs (cloud, zone, instance type), when
	// its metadata said.
	Machine *checkpoint.Machine `json:"machine,omitempty"`
	Updated time.Time           `json:"updated"`
}

const recordDir = "peers/"

// maxRecord bounds the bytes of a record read.
const maxRecord = 64 << 10

func recordKey(node string) string { return recordDir + node + ".json" }

func putRecord(ctx context.Context, st cloud.Store, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, recordKey(r.Node), bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
		return fmt.Errorf("put %s: %w", recordKey(r.Node), err)
	}
	return nil
}

// getRecord reads node's record; nil, nil when it has none.
func getRecord(ctx context.Context, st cloud.Store, node string) (*Record, error) {
	rc, err := st.Get(ctx, recordKey(node), 0, -1)
	if errors.Is(err, cloud.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", recordKey(node), err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxRecord+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", recordKey(node), err)
	}
	if len(b) > maxRecord {
		return nil, fmt.Errorf("%s: larger than %d bytes", recordKey(node), maxRecord)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", recordKey(node), err)
	}
	if r.Node != node {
		return nil, fmt.Errorf("%s: names node %q", recordKey(node), r.Node)
	}
	return &r, nil
}
