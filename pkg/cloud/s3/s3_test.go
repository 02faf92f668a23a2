package s3_test

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
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
	bucket := cloudtest.CloudEnv(t, "SPOTAGENT_TEST_S3_BUCKET", "real S3")
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, bucket, s3.Options{PartSize: 5 << 20})
	})
}

// Every part and single PUT carries a CRC32C that the server checks (the
// fake rejects a wrong one, as S3 does). That the store, not the SDK,
// computed it is TestChecksumsComeFromTheStore's to show.
func TestChecksumsVerifiedByServer(t *testing.T) {
	srv := s3test.New(t)
	st := newStore(t, srv.Bucket, s3.Options{PartSize: 5 << 20, Concurrency: 2})
	data := make([]byte, 12<<20+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	// HalfReader: reads that end mid-part, as a hashing reader's do.
	if err := st.Put(t.Context(), "big", iotest.HalfReader(bytes.NewReader(data)), int64(len(data)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(t.Context(), "small", bytes.NewReader(data[:1000]), 1000, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := srv.Verified(), int64(3+1); got != want {
		t.Fatalf("server verified %d checksums, want %d (3 parts + 1 object)", got, want)
	}
	r, err := st.Get(t.Context(), "big", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v; want the %d written", len(got), err, len(data))
	}

	// The check can fail: a wrong checksum is refused.
	_, err = st.(*s3.Store).Client().PutObject(t.Context(), &awss3.PutObjectInput{
		Bucket: aws.String(srv.Bucket), Key: aws.String("bad"), Body: bytes.NewReader([]byte("payload")),
		ChecksumCRC32C: aws.String("AAAAAA=="),
	})
	if err == nil || !strings.Contains(err.Error(), "BadDigest") {
		t.Fatalf("put with a wrong crc32c: %v, want BadDigest", err)
	}
}
