package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// fill must read exactly like io.ReadFull (the upload loop relies on its
// EOF and ErrUnexpectedEOF) and return the CRC32C of the bytes it read.
func TestFill(t *testing.T) {
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	boom := errors.New("boom")
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(data) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
		"error":    func() io.Reader { return io.MultiReader(bytes.NewReader(data[:300]), iotest.ErrReader(boom)) },
		// An error that wraps EOF is an error, not the end (io.ReadFull agrees).
		"wrapped EOF": func() io.Reader {
			return io.MultiReader(bytes.NewReader(data[:300]), iotest.ErrReader(fmt.Errorf("truncated: %w", io.EOF)))
		},
	}
	for name, mk := range readers {
		for _, size := range []int{0, 1, 300, 999, 1000, 1001, 4096} {
			want := make([]byte, size)
			wn, werr := io.ReadFull(mk(), want)
			got := make([]byte, size)
			whole := crc32.Checksum([]byte("before"), castagnoli)
			n, crc, err := fill(mk(), got, &whole)
			if n != wn || fmt.Sprint(err) != fmt.Sprint(werr) {
				t.Errorf("%s, buf %d: fill = %d, %v; io.ReadFull = %d, %v", name, size, n, err, wn, werr)
				continue
			}
			if !bytes.Equal(got[:n], want[:wn]) {
				t.Errorf("%s, buf %d: bytes differ from io.ReadFull's", name, size)
			}
			if w := crc32.Checksum(got[:n], castagnoli); crc != w {
				t.Errorf("%s, buf %d: crc %08x, want %08x", name, size, crc, w)
			}
			if w := crc32.Checksum(append([]byte("before"), got[:n]...), castagnoli); whole != w {
				t.Errorf("%s, buf %d: whole crc %08x, want %08x", name, size, whole, w)
			}
		}
	}
}

func TestChecksumEncoding(t *testing.T) {
	// CRC-32C check value (RFC 3720, B.4): "123456789" → 0xE3069283.
	if got := *checksum(crc32.Checksum([]byte("123456789"), castagnoli)); got != "4waSgw==" {
		t.Fatalf("checksum = %q, want 4waSgw==", got)
	}
}

// The store, not the SDK, computes each part's CRC32C (in the read pass);
// over plain HTTP the SDK would otherwise fill in one of its own, so the
// server's check alone cannot tell who did.
func TestChecksumsComeFromTheStore(t *testing.T) {
	srv := s3test.New(t)
	st, err := New(t.Context(), srv.Bucket, "sums", Options{PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	given := map[string]int{} // operation → inputs that arrived with a CRC32C set
	var whole *string         // CompleteMultipartUpload's full-object CRC32C
	capture := middleware.InitializeMiddlewareFunc("captureChecksum", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
		mu.Lock()
		switch p := in.Parameters.(type) {
		case *s3.UploadPartInput:
			if p.ChecksumCRC32C != nil {
				given["UploadPart"]++
			}
		case *s3.PutObjectInput:
			if p.ChecksumCRC32C != nil {
				given["PutObject"]++
			}
		case *s3.CreateMultipartUploadInput:
			if p.ChecksumType == types.ChecksumTypeFullObject {
				given["Create FULL_OBJECT"]++
			}
		case *s3.CompleteMultipartUploadInput:
			if p.ChecksumType == types.ChecksumTypeFullObject {
				given["Complete FULL_OBJECT"]++
			}
			whole = p.ChecksumCRC32C
		}
		mu.Unlock()
		return next.HandleInitialize(ctx, in)
	})
	st.client = s3.New(st.client.Options(), func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error { return s.Initialize.Add(capture, middleware.Before) })
	})
	data := bytes.Repeat([]byte("checkpoint"), 1<<20) // 10 MiB: 2 parts
	if err := st.Put(t.Context(), "big", bytes.NewReader(data), int64(len(data)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(t.Context(), "small", bytes.NewReader(data[:100]), 100, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if given["UploadPart"] != 2 || given["PutObject"] != 1 || given["Create FULL_OBJECT"] != 1 || given["Complete FULL_OBJECT"] != 1 {
		t.Fatalf("inputs with the store's CRC32C: %v, want 2 UploadPart, 1 PutObject and a full-object upload", given)
	}
	// The whole object's CRC32C, which the committer records in the
	// manifest, is what the server checks at Complete.
	if want := checksum(crc32.Checksum(data, castagnoli)); whole == nil || *whole != *want {
		t.Fatalf("Complete sent crc32c %v, want %s", whole, *want)
	}
	if got := srv.Verified(); got != 3 {
		t.Fatalf("server verified %d checksums, want 3", got)
	}
}

// Put's requests are retried by the SDK with its backoff of up to 20 s; a
// context bounded by cloud.WithMaxWait (the run journal's writes at exit)
// caps it: a journal Put sat in a 10–20 s wait while the store came back
// and the exit's 10 s wait for it ran out, so the failed interruption
// checkpoint's record was lost (cmd/spotagent
// TestStoreFault_DownDuringInterruption, 1 full run in 8).
func TestPutRetries_MaxWait(t *testing.T) {
	s := &Store{putRetryer: newRetryer(defaultMaxAttempts)}
	retryer := func(ctx context.Context) (r interface {
		RetryDelay(int, error) (time.Duration, error)
	}) {
		var o s3.Options
		s.withPutRetries(ctx)(&o)
		return o.Retryer
	}
	reset := errors.New("read: connection reset by peer")
	longest := func(ctx context.Context) time.Duration {
		var m time.Duration
		for range 100 {
			d, err := retryer(ctx).RetryDelay(8, reset)
			if err != nil {
				t.Fatal(err)
			}
			m = max(m, d)
		}
		return m
	}
	if got := longest(cloud.WithMaxWait(context.Background(), 2*time.Second)); got > 2*time.Second {
		t.Fatalf("a wait of %s under a 2 s bound", got)
	}
	if got := longest(context.Background()); got <= 2*time.Second {
		t.Fatalf("longest wait %s without a bound: the test does not see the SDK's backoff", got)
	}
}
