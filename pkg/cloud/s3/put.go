package s3

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// abortTimeout bounds the cleanup of a failed upload; it runs on a context
// detached from the (possibly cancelled) caller's.
const abortTimeout = 30 * time.Second

// Put uploads r. Objects up to one part go in a single PutObject; larger
// ones as a multipart upload whose parts are read into buffers from the
// store's shared pool and sent Concurrency at a time. A failed or
// cancelled multipart upload is aborted, so no parts are left behind.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	if src, ok := r.(cloud.FileSource); ok && size >= 0 {
		if _, fsize := src.SourceFile(); fsize == size {
			return s.putFile(ctx, k, src, opts)
		}
	}
	part := s.partSize(size)
	first := part
	if size >= 0 && size <= part {
		first = size
	}
	buf, err := s.pool.get(ctx, first)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	cr := cloud.ContextReader(ctx, r)
	var whole uint32
	n, crc, err := fill(cr, buf, &whole)
	last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err == nil && size >= 0 && size <= part {
		last, err = atEOF(cr)
	}
	if err != nil && !last {
		s.pool.put(buf)
		return fmt.Errorf("put %s: read: %w", key, err)
	}
	if last {
		defer s.pool.put(buf)
		if size >= 0 && int64(n) != size {
			return fmt.Errorf("put %s: read %d bytes, want %d", key, n, size)
		}
		return s.putObject(ctx, k, buf[:n], crc, opts)
	}
	return s.multipart(ctx, k, buf, crc, whole, cr, size, part, opts)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fill reads r into buf like io.ReadFull and returns the CRC32C of what it
// read; it also carries on *whole, the CRC32C of the object so far. Both
// are taken read by read, while the bytes are still in the CPU cache (the
// committer's reader hands out 256 KiB at a time; CRC32C runs at ~25 GB/s
// with SSE4.2), and sent with the requests: the SDK would otherwise make a
// second pass over each part from memory.
func fill(r io.Reader, buf []byte, whole *uint32) (n int, crc uint32, err error) {
	for n < len(buf) && err == nil {
		var m int
		m, err = r.Read(buf[n:])
		crc = crc32.Update(crc, castagnoli, buf[n:n+m])
		*whole = crc32.Update(*whole, castagnoli, buf[n:n+m])
		n += m
	}
	switch {
	case n == len(buf):
		err = nil
	case n > 0 && err == io.EOF: // as io.ReadFull: only EOF itself, not an error wrapping it
		err = io.ErrUnexpectedEOF
	}
	return n, crc, err
}

// checksum is the x-amz-checksum-crc32c value of crc.
func checksum(crc uint32) *string {
	return aws.String(base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, crc)))
}

// partSize grows the part size for objects that would need more than
// S3's 10,000 parts, rounded up to a whole MiB.
func (s *Store) partSize(size int64) int64 {
	p := s.opts.PartSize
	if size > p*maxParts {
		p = (size/maxParts + 1 + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return p
}

// atEOF reports whether r has nothing left to read.
func atEOF(r io.Reader) (bool, error) {
	var b [1]byte
	n, err := io.ReadFull(r, b[:])
	if n == 0 && errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, errors.New("more bytes than the given size")
}

func (s *Store) putObject(ctx context.Context, k *string, data []byte, crc uint32, opts cloud.PutOptions) error {
	return s.putObjectFrom(ctx, k, bytes.NewReader(data), int64(len(data)), crc, opts)
}

// putObjectFrom sends body (n bytes, CRC32C crc) in one PutObject; the SDK
// rewinds body by Seek for a retry.
func (s *Store) putObjectFrom(ctx context.Context, k *string, body io.ReadSeeker, n int64, crc uint32, opts cloud.PutOptions) error {
	in := &s3.PutObjectInput{
		Bucket: &s.bucket, Key: k, Body: body,
		ContentLength:     aws.Int64(n),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c, ChecksumCRC32C: checksum(crc),
	}
	in.IfNoneMatch, in.IfMatch = conditions(opts)
	if _, err := s.client.PutObject(ctx, in, s.withPutRetries(ctx)); err != nil {
		return fmt.Errorf("put %s: %w", *k, translate(err))
	}
	return nil
}

func conditions(opts cloud.PutOptions) (ifNoneMatch, ifMatch *string) {
	if opts.IfAbsent {
		ifNoneMatch = aws.String("*")
	}
	if opts.IfVersion != "" {
		ifMatch = aws.String(opts.IfVersion)
	}
	return ifNoneMatch, ifMatch
}

type upload struct {
	s     *Store
	k     *string
	id    *string
	whole uint32 // CRC32C of the object, once send returned
	mu    sync.Mutex
	done  []types.CompletedPart
}

// multipart uploads the object in parts. The upload is declared with a
// full-object CRC32C (ChecksumType FULL_OBJECT): the server checks each
// part's CRC32C as it arrives and, at Complete, the CRC32C of the whole
// object, which is the value the committer records in the manifest.
func (s *Store) multipart(ctx context.Context, k *string, first []byte, crc, whole uint32, r io.Reader, size, part int64, opts cloud.PutOptions) error {
	out, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &s.bucket, Key: k, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ChecksumType: types.ChecksumTypeFullObject,
	}, s.withPutRetries(ctx))
	if err != nil {
		s.pool.put(first)
		return fmt.Errorf("put %s: create upload: %w", *k, translate(err))
	}
	u := &upload{s: s, k: k, id: out.UploadId, whole: whole}
	start := time.Now()
	total, err := u.send(ctx, first, crc, r, part)
	if err == nil && size >= 0 && total != size {
		err = fmt.Errorf("read %d bytes, want %d", total, size)
	}
	if err == nil {
		err = u.complete(ctx, opts)
	}
	if err != nil {
		u.abort(ctx, err)
		return fmt.Errorf("put %s: %w", *k, err)
	}
	s.log.Debug("multipart upload done", zap.String("key", *k), zap.Int64("bytes", total),
		zap.Int("parts", len(u.done)), zap.Duration("took", time.Since(start)))
	return nil
}

// send reads r part by part and uploads the parts concurrently. buf holds
// the first (full) part, whose CRC32C is crc; send owns it. u.whole carries
// the object's CRC32C from the first part on.
func (u *upload) send(ctx context.Context, buf []byte, crc uint32, r io.Reader, part int64) (int64, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(u.s.opts.Concurrency)
	total := int64(len(buf))
	for num := int32(1); ; num++ {
		if num > maxParts {
			u.s.pool.put(buf)
			g.Go(func() error { return errors.New("more than 10000 parts") })
			break
		}
		body, n, sum := buf, num, crc
		g.Go(func() error {
			defer u.s.pool.put(body)
			return u.part(gctx, n, body, sum)
		})
		var err error
		if buf, err = u.s.pool.get(gctx, part); err != nil {
			g.Go(func() error { return err })
			break
		}
		var m int
		m, crc, err = fill(cloud.ContextReader(gctx, r), buf, &u.whole)
		total += int64(m)
		if m == 0 && errors.Is(err, io.EOF) {
			u.s.pool.put(buf)
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			body, n, sum := buf, num+1, crc
			g.Go(func() error {
				defer u.s.pool.put(body)
				return u.part(gctx, n, body[:m], sum)
			})
			break
		}
		if err != nil {
			u.s.pool.put(buf)
			g.Go(func() error { return fmt.Errorf("read: %w", err) })
			break
		}
	}
	return total, g.Wait()
}

func (u *upload) part(ctx context.Context, num int32, data []byte, crc uint32) error {
	return u.partFrom(ctx, num, bytes.NewReader(data), int64(len(data)), crc)
}

// partFrom uploads part num from body (n bytes, CRC32C crc); the SDK
// rewinds body by Seek for a retry.
func (u *upload) partFrom(ctx context.Context, num int32, body io.ReadSeeker, n int64, crc uint32) error {
	out, err := u.s.client.UploadPart(ctx, &s3.UploadPartInput{
		Bucket: &u.s.bucket, Key: u.k, UploadId: u.id, PartNumber: aws.Int32(num),
		Body: body, ContentLength: aws.Int64(n),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c, ChecksumCRC32C: checksum(crc),
	}, u.s.withPutRetries(ctx))
	if err != nil {
		return fmt.Errorf("part %d: %w", num, translate(err))
	}
	u.mu.Lock()
	// Complete needs each part's checksum; a server that does not echo it
	// gets the one sent.
	u.done = append(u.done, types.CompletedPart{PartNumber: aws.Int32(num), ETag: out.ETag, ChecksumCRC32C: cmp.Or(out.ChecksumCRC32C, checksum(crc))})
	u.mu.Unlock()
	return nil
}

func (u *upload) complete(ctx context.Context, opts cloud.PutOptions) error {
	slices.SortFunc(u.done, func(a, b types.CompletedPart) int { return int(*a.PartNumber - *b.PartNumber) })
	in := &s3.CompleteMultipartUploadInput{
		Bucket: &u.s.bucket, Key: u.k, UploadId: u.id,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: u.done},
		ChecksumCRC32C:  checksum(u.whole), ChecksumType: types.ChecksumTypeFullObject,
	}
	in.IfNoneMatch, in.IfMatch = conditions(opts)
	if _, err := u.s.client.CompleteMultipartUpload(ctx, in, u.s.withPutRetries(ctx)); err != nil {
		return fmt.Errorf("complete upload: %w", translate(err))
	}
	return nil
}

// abort removes the upload's parts, on a context that outlives a
// cancelled caller.
func (u *upload) abort(ctx context.Context, cause error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	_, err := u.s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
		Bucket: &u.s.bucket, Key: u.k, UploadId: u.id,
	}, u.s.withPutRetries(ctx))
	if err != nil {
		// Cleanup on the next start removes it.
		u.s.log.Warn("abort multipart upload failed", zap.String("key", *u.k), zap.NamedError("cause", cause), zap.Error(err))
		return
	}
	u.s.log.Info("multipart upload aborted", zap.String("key", *u.k), zap.Error(cause))
}
