package s3_test

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
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

// gatedReader yields n bytes, pausing after the first half until open is
// closed.
type gatedReader struct {
	data  []byte
	off   int
	half  chan struct{} // closed when the first half is read
	open  chan struct{}
	first sync.Once
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.off >= len(g.data) {
		return 0, io.EOF
	}
	if g.off >= len(g.data)/2 {
		g.first.Do(func() { close(g.half) })
		<-g.open
	}
	end := min(len(g.data), g.off+len(p))
	if g.off < len(g.data)/2 {
		end = min(end, len(g.data)/2)
	}
	n := copy(p, g.data[g.off:end])
	g.off += n
	return n, nil
}

// Two agents of one job share a store: B's cleanup at start (part mode)
// aborts its own dead upload and never the upload A has in flight. Without
// options it does abort A's (the single-agent behaviour).
func TestCleanup_SparesOtherParts(t *testing.T) {
	for _, mode := range []string{"part", "all"} {
		t.Run(mode, func(t *testing.T) {
			srv := s3test.New(t)
			ctx := t.Context()
			open := func() *s3.Store {
				st, err := s3.New(ctx, srv.Bucket, "run", s3.Options{PartSize: 5 << 20, BufferMemory: 10 << 20})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			}
			a, b := open(), open()
			aKey := checkpoint.PartPrefix(7, "abcdefabcdef", "node-0") + "rank-0.pt"
			bKey := "run/" + checkpoint.PartPrefix(5, "012345012345", "node-1") + "rank-2.pt"
			// B's previous life died mid-upload.
			if _, err := b.Client().CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &srv.Bucket, Key: &bKey}); err != nil {
				t.Fatal(err)
			}
			// A is uploading right now.
			r := &gatedReader{data: cloudtest.Random(7, 12<<20), half: make(chan struct{}), open: make(chan struct{})}
			done := make(chan error, 1)
			go func() { done <- a.Put(ctx, aKey, r, int64(len(r.data)), cloud.PutOptions{}) }()
			<-r.half
			waitUploads(t, b, srv.Bucket, 2)

			var opts []cloud.CleanupOptions
			if mode == "part" {
				opts = append(opts, checkpoint.PartCleanup("node-1"))
			}
			n, err := b.Cleanup(ctx, opts...)
			close(r.open)
			if err != nil {
				t.Fatal(err)
			}
			perr := <-done
			switch mode {
			case "part":
				if n != 1 || perr != nil {
					t.Fatalf("cleanup aborted %d, A's put: %v; want 1 (B's own), nil", n, perr)
				}
				rc, err := a.Get(ctx, aKey, 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(rc)
				rc.Close()
				if !bytes.Equal(got, r.data) {
					t.Fatal("A's object differs from what it wrote")
				}
			case "all":
				if n != 2 || perr == nil {
					t.Fatalf("cleanup aborted %d, A's put: %v; want 2, an error", n, perr)
				}
			}
		})
	}
}

// waitUploads waits until n multipart uploads are in progress.
func waitUploads(t *testing.T, st *s3.Store, bucket string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := st.Client().ListMultipartUploads(t.Context(), &awss3.ListMultipartUploadsInput{Bucket: &bucket})
		if err == nil && len(out.Uploads) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d uploads in progress (%v), want %d", len(out.Uploads), err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCleanupOptions_Removes(t *testing.T) {
	now := time.Now()
	o := checkpoint.PartCleanup("node-1")
	for _, c := range []struct {
		key     string
		started time.Time
		want    bool
	}{
		{"checkpoints/000000000005-x/node-1/a/b", now, true},
		{"checkpoints/000000000005-x/node-0/a/b", now, false},
		{"checkpoints/000000000005-x/node-0/node-1/b", now, false},
		{"checkpoints/000000000005-x/node-10/b", now, false},
		{"checkpoints/000000000005-x/node-0/a", now.Add(-25 * time.Hour), true},
		{"checkpoints/000000000005-x/node-0/a", time.Time{}, false},
		{"journal.json", now, false},
	} {
		if got := o.Removes(c.key, c.started, now); got != c.want {
			t.Errorf("Removes(%s, %v)=%v, want %v", c.key, now.Sub(c.started), got, c.want)
		}
	}
	if !(cloud.CleanupOptions{}).Removes("anything", now, now) {
		t.Error("the zero options spare something")
	}
}
