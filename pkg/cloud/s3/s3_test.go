package s3_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
	"github.com/spotagent/spotagent/pkg/cloud/s3/s3test"
)

// newStore returns a store under a fresh prefix of bucket, emptied at the end.
func newStore(t *testing.T, bucket string, opts s3.Options) cloud.Store {
	t.Helper()
	st, err := s3.New(t.Context(), bucket, cloudtest.Prefix(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cloudtest.Empty(t, st) })
	return st
}

func TestConformance(t *testing.T) {
	_, bucket := s3test.NewServer(t)
	// 5 MiB parts (S3's minimum) so the 64 MiB object takes 13 parts.
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, s3.Options{PartSize: 5 << 20, Concurrency: 4})
	})
}

func TestConformanceRealS3(t *testing.T) {
	bucket := os.Getenv("SPOTAGENT_TEST_S3_BUCKET")
	if bucket == "" {
		fmt.Println("real S3: not run (SPOTAGENT_TEST_S3_BUCKET is unset)")
		t.Log("real S3: not run (SPOTAGENT_TEST_S3_BUCKET is unset)")
		return
	}
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, s3.Options{PartSize: 5 << 20})
	})
}
