package cloudtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

var seq atomic.Int64

// Prefix returns a prefix no other test store uses, for a store in a
// shared bucket.
func Prefix() string {
	return fmt.Sprintf("spotagent-test/%d-%d", time.Now().UnixNano(), seq.Add(1))
}

// Empty removes what a test left in st: leftovers its Cleanup finds (when
// st is a cloud.Cleaner), then every listed object. It runs on its own
// context, so it works from t.Cleanup.
func Empty(t testing.TB, st cloud.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if cl, ok := st.(cloud.Cleaner); ok {
		if _, err := cl.Cleanup(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	var keys []string
	_ = st.List(ctx, "", func(oi cloud.ObjectInfo) error { keys = append(keys, oi.Key); return nil })
	for _, k := range keys {
		if err := st.Delete(ctx, k); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// Plain is the backend under the layers all.Open stacks around it (st
// itself when it has none), for tests that need the backend's own methods.
func Plain(st cloud.Store) cloud.Store {
	for {
		u, ok := st.(interface{ Unwrap() cloud.Store })
		if !ok {
			return st
		}
		st = u.Unwrap()
	}
}
