package s3

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Uploads straight from a file (cloud.FileSource), without part buffers.
//
// Put of a plain reader copies every part into a 16 MiB buffer before it
// is sent (the SDK needs a body it can rewind for a retry), and that copy
// goes to memory no cache holds: with the HTTP client's own copy out of it,
// it cost more CPU than everything else in an upload. A file can be re-read
// instead: each part's body is a section of the file (io.SectionReader,
// which the SDK rewinds by Seek), read by the HTTP client in 32 KiB steps
// that stay in the CPU cache. The part's CRC32C must be in its header, so
// the store reads the part once before (256 KiB at a time, also in cache),
// taking the part's and the whole object's CRC32C. If the file changes
// between that read and the send, the server's check of the part's CRC32C
// (or of the whole object's at Complete) fails the upload: what is stored
// is always what was checksummed.
//
// Parts in flight are still bounded by the store's buffer budget (the same
// semaphore, no memory behind it), so memory and connections stay as they
// were.

// scanChunk is the size of the reads that checksum a part before it is sent.
const scanChunk = 256 << 10

var scanBufs = sync.Pool{New: func() any { b := make([]byte, scanChunk); return &b }}

// crcRange returns the CRC32C of f's bytes [off, off+n), and carries whole
// over them; src sees each run read (cloud.ReportScanned). A file shorter
// than off+n is an error.
func crcRange(ctx context.Context, f *os.File, off, n int64, whole *uint32, src cloud.FileSource) (uint32, error) {
	bp := scanBufs.Get().(*[]byte)
	defer scanBufs.Put(bp)
	buf := *bp
	var crc uint32
	for done := int64(0); done < n; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		m, err := f.ReadAt(buf[:min(int64(len(buf)), n-done)], off+done)
		crc = crc32.Update(crc, castagnoli, buf[:m])
		*whole = crc32.Update(*whole, castagnoli, buf[:m])
		cloud.ReportScanned(src, buf[:m])
		done += int64(m)
		if err != nil && done < n {
			if errors.Is(err, io.EOF) {
				return 0, fmt.Errorf("file shrank: %d bytes, want %d", off+done, off+n)
			}
			return 0, err
		}
	}
	return crc, nil
}

// noMore checks that f ends at size.
func noMore(f *os.File, size int64) error {
	var b [1]byte
	if n, _ := f.ReadAt(b[:], size); n > 0 {
		return fmt.Errorf("file grew past %d bytes", size)
	}
	return nil
}

func (s *Store) putFile(ctx context.Context, k *string, src cloud.FileSource, opts cloud.PutOptions) error {
	f, size := src.SourceFile()
	part := s.partSize(size)
	var whole uint32
	if size <= part {
		crc, err := crcRange(ctx, f, 0, size, &whole, src)
		if err == nil {
			err = noMore(f, size)
		}
		if err != nil {
			return fmt.Errorf("put %s: read: %w", *k, err)
		}
		if err := s.putObjectFrom(ctx, k, io.NewSectionReader(f, 0, size), size, crc, opts); err != nil {
			return err
		}
		src.Sent(size, crc)
		return nil
	}
	out, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &s.bucket, Key: k, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ChecksumType: types.ChecksumTypeFullObject,
	}, s.withPutRetries(ctx))
	if err != nil {
		return fmt.Errorf("put %s: create upload: %w", *k, translate(err))
	}
	u := &upload{s: s, k: k, id: out.UploadId}
	start := time.Now()
	err = u.sendFile(ctx, src, f, size, part, func(n int64) { cloud.ReportProgress(src, n) })
	if err == nil {
		err = u.complete(ctx, opts)
	}
	if err != nil {
		u.abort(ctx, err)
		return fmt.Errorf("put %s: %w", *k, err)
	}
	s.log.Debug("multipart upload done", zap.String("key", *k), zap.Int64("bytes", size),
		zap.Int("parts", len(u.done)), zap.Duration("took", time.Since(start)), zap.Bool("from_file", true))
	src.Sent(size, u.whole)
	return nil
}

// sendFile checksums f part by part, in order, and uploads the parts
// concurrently as sections of f; sent is called with each part's size once it is uploaded.
func (u *upload) sendFile(ctx context.Context, src cloud.FileSource, f *os.File, size, part int64, sent func(int64)) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(u.s.opts.Concurrency)
	num := int32(0)
	for off := int64(0); off < size; off += part {
		num++
		if num > maxParts {
			g.Go(func() error { return errors.New("more than 10000 parts") })
			break
		}
		n := min(part, size-off)
		crc, err := crcRange(gctx, f, off, n, &u.whole, src)
		if err != nil {
			g.Go(func() error { return fmt.Errorf("read: %w", err) })
			break
		}
		// A part in flight holds its share of the buffer budget, though
		// no buffer: the process-wide bound on parts in flight stays.
		if err := u.s.pool.sem.Acquire(gctx, min(n, u.s.pool.budget)); err != nil {
			g.Go(func() error { return err })
			break
		}
		pn := num
		g.Go(func() error {
			defer u.s.pool.sem.Release(min(n, u.s.pool.budget))
			if err := u.partFrom(gctx, pn, io.NewSectionReader(f, off, n), n, crc); err != nil {
				return err
			}
			sent(n)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return noMore(f, size)
}
