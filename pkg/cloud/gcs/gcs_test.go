package gcs_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/gcs"
	"github.com/spotagent/spotagent/pkg/cloud/gcs/gcstest"
)

var seq atomic.Int64

func newStore(t *testing.T, bucket string, opts gcs.Options) cloud.Store {
	t.Helper()
	prefix := fmt.Sprintf("spotagent-test/%d-%d", time.Now().UnixNano(), seq.Add(1))
	st, err := gcs.New(t.Context(), bucket, prefix, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var keys []string
		_ = st.List(ctx, "", func(oi cloud.ObjectInfo) error { keys = append(keys, oi.Key); return nil })
		for _, k := range keys {
			if err := st.Delete(ctx, k); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		st.Close()
	})
	return st
}

func TestConformance(t *testing.T) {
	_, bucket := gcstest.NewServer(t)
	// 8 MiB chunks so the 64 MiB object takes several resumable requests.
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, gcs.Options{ChunkSize: 8 << 20})
	})
}

func TestConformanceRealGCS(t *testing.T) {
	bucket := os.Getenv("SPOTAGENT_TEST_GCS_BUCKET")
	if bucket == "" {
		fmt.Println("real GCS: not run (SPOTAGENT_TEST_GCS_BUCKET is unset)")
		t.Log("real GCS: not run (SPOTAGENT_TEST_GCS_BUCKET is unset)")
		return
	}
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, gcs.Options{})
	})
}
