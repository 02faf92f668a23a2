package s3_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

func TestAbortIncompleteUploads(t *testing.T) {
	_, bucket := s3test.NewServer(t)
	st, err := s3.New(t.Context(), bucket, "run", s3.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// What a writer killed mid-upload leaves: an upload with one part.
	up, err := st.Client().CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &bucket, Key: aws.String("run/ck/a")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().UploadPart(ctx, &awss3.UploadPartInput{Bucket: &bucket, Key: aws.String("run/ck/a"),
		UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("part")}); err != nil {
		t.Fatal(err)
	}
	// Outside the prefix: not ours to abort.
	if _, err := st.Client().CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &bucket, Key: aws.String("other/x")}); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Cleanup(ctx); err != nil || n != 1 {
		t.Fatalf("cleanup=%d, %v; want 1, nil", n, err)
	}
	if n, err := st.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("second cleanup=%d, %v; want 0, nil", n, err)
	}
}

func TestMultipartParts(t *testing.T) {
	srv := s3test.New(t)
	st, err := s3.New(t.Context(), srv.Bucket, "", s3.Options{PartSize: 5 << 20, BufferMemory: 10 << 20})
	if err != nil {
		t.Fatal(err)
	}
	data := cloudtest.Random(5, 12<<20)
	if err := st.Put(t.Context(), "m", bytes.NewReader(data), int64(len(data)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// 12 MiB in 5 MiB parts, with buffers for only two parts at a time.
	if got, want := srv.PartUploads(), int64(3); got != want {
		t.Fatalf("parts=%d, want %d", got, want)
	}
	rc, err := st.Get(t.Context(), "m", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}
}
