package gcs

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"cloud.google.com/go/storage"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// singleMax is the largest file uploaded in one request. A checkpoint
// file (cloud.FileSource) up to this size goes in a single request
// (storage.Writer with ChunkSize 0: no chunk buffer, no per-chunk round
// trips) with its CRC32C, taken by reading the file once before, sent for
// the server to check before it creates the object. GCS documents
// single-request uploads as the most efficient when a failed upload can
// simply be sent again; chunked resumable uploads cost a request per chunk.
// On fake-gcs-server a 256 MiB file went at 39-49 MB/s in 16 MiB chunks,
// 118-126 MB/s as one 256 MiB chunk and 166-178 MB/s in one request (its
// resumable path re-reads the whole object at every chunk). Without a
// chunk buffer the library cannot resend, so Put does: the file can be
// read again. Larger files keep the resumable, chunked upload.
const singleMax = 1 << 30

// singleAttempts bounds the sends of a single-request upload: ten, as S3's
// uploads (pkg/cloud/s3 defaultMaxAttempts; retry's backoff, 100 ms
// doubling to 5 s, about 20 s in all): spot networks flap, and three
// resets in a row used to fail a checkpoint file.
const singleAttempts = 10

// putFile uploads src in one request.
func (s *Store) putFile(ctx context.Context, o *storage.ObjectHandle, key string, src cloud.FileSource) error {
	f, size := src.SourceFile()
	crc, err := fileCRC(ctx, src, size)
	if err != nil {
		return fmt.Errorf("put %s: read: %w", key, err)
	}
	p := retry.Policy{Attempts: singleAttempts, Retryable: storage.ShouldRetry}
	if d := cloud.MaxWait(ctx); d > 0 {
		p.Backoff = p.Backoff.Capped(d)
	}
	err = retry.Do(ctx, p, func(ctx context.Context) error {
		// Progress as the body is read: a retry counts again, and Sent
		// settles the total.
		return s.putOnce(ctx, o, &progressReader{r: io.NewSectionReader(f, 0, size), src: src}, crc)
	})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, translate(err))
	}
	src.Sent(size, crc)
	return nil
}

func (s *Store) putOnce(ctx context.Context, o *storage.ObjectHandle, r io.Reader, crc uint32) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := o.NewWriter(wctx)
	w.ChunkSize = 0
	w.ContentType = "application/octet-stream"
	w.CRC32C, w.SendCRC32C = crc, true
	if _, err := io.Copy(w, cloud.ContextReader(ctx, r)); err != nil {
		cancel()
		_ = w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if got := w.Attrs().CRC32C; got != crc {
		return fmt.Errorf("server crc32c %08x, sent %08x", got, crc)
	}
	return nil
}

// fileCRC reads src's file's size bytes and returns their CRC32C; src sees
// them too (cloud.ReportScanned). A file of another length is an error.
func fileCRC(ctx context.Context, src cloud.FileSource, size int64) (uint32, error) {
	f, _ := src.SourceFile()
	h := crc32.New(castagnoli)
	n, err := io.Copy(scanWriter{h, src}, cloud.ContextReader(ctx, io.NewSectionReader(f, 0, size+1)))
	if err != nil {
		return 0, err
	}
	if n != size {
		return 0, errors.New("file changed size while it was read")
	}
	return h.Sum32(), nil
}

// scanWriter hashes what is written and shows it to a file source.
type scanWriter struct {
	h   io.Writer
	src cloud.FileSource
}

func (w scanWriter) Write(p []byte) (int, error) {
	cloud.ReportScanned(w.src, p)
	return w.h.Write(p)
}

// progressReader reports each read of a file source's body to its Progress.
type progressReader struct {
	r   io.Reader
	src cloud.FileSource
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	cloud.ReportProgress(p.src, int64(n))
	return n, err
}
