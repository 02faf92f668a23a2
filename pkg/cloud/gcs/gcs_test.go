package gcs_test

import (
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/gcs"
)

// newStore returns a store under a fresh prefix of bucket, emptied at the end.
func newStore(t *testing.T, bucket string, opts gcs.Options) cloud.Store {
	t.Helper()
	st, err := gcs.New(t.Context(), bucket, cloudtest.Prefix(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cloudtest.Empty(t, st)
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
	bucket := cloudtest.CloudEnv(t, "SPOTAGENT_TEST_GCS_BUCKET", "real GCS")
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, gcs.Options{})
	})
}
