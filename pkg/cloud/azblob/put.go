package azblob

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Put uploads r, reading it once: the committer's reader takes the CRC32C
// the manifest records as the store reads it, so what is stored is what
// was checksummed. (The S3 and GCS stores may instead send a
// cloud.FileSource straight from the file after a checksum pass of their
// own, because their servers check that checksum; Azure checks CRC64 or
// MD5 only, so a file that changed between the two reads would be stored
// under a CRC32C that does not match it. This store ignores FileSource.)
//
// Put uploads r. An unconditional object of up to one block goes in a
// single Put Blob; anything larger, and every conditional write, is staged
// as blocks (read into buffers from the shared pool and sent Concurrency
// at a time) and made visible by one Put Block List, which carries the
// conditions. Until that commit nothing is visible: a failed or cancelled
// Put leaves only uncommitted blocks, which no reader or listing sees and
// Azure discards after a week (they cannot be deleted on their own).
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	conditional := opts.IfAbsent || opts.IfVersion != ""
	block := s.blockSize(size)
	first := block
	if size >= 0 && size <= block {
		first = size
	}
	buf, err := s.pool.get(ctx, first)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	cr := cloud.ContextReader(ctx, r)
	n, err := fill(cr, buf)
	last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err == nil && size >= 0 && size <= block {
		last, err = atEOF(cr)
	}
	if err != nil && !last {
		s.pool.put(buf)
		return fmt.Errorf("put %s: read: %w", key, err)
	}
	if last && size >= 0 && int64(n) != size {
		s.pool.put(buf)
		return fmt.Errorf("put %s: read %d bytes, want %d", key, n, size)
	}
	if last && !conditional {
		failed, err := s.putBlob(ctx, name, buf[:n], opts)
		if failed {
			s.pool.drop(buf)
		} else {
			s.pool.put(buf)
		}
		return err
	}
	u, err := s.newUpload(name)
	if err != nil {
		s.pool.put(buf)
		return fmt.Errorf("put %s: %w", name, err)
	}
	start := time.Now()
	total, err := u.send(ctx, buf[:n], last, cr, block)
	if err == nil && size >= 0 && total != size {
		err = fmt.Errorf("read %d bytes, want %d", total, size)
	}
	if err == nil {
		err = u.commit(ctx, opts)
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	s.log.Debug("block upload done", zap.String("key", name), zap.Int64("bytes", total),
		zap.Int("blocks", len(u.ids)), zap.Duration("took", time.Since(start)))
	return nil
}

// fill reads r into buf like io.ReadFull.
func fill(r io.Reader, buf []byte) (n int, err error) {
	for n < len(buf) && err == nil {
		var m int
		m, err = r.Read(buf[n:])
		n += m
	}
	switch {
	case n == len(buf):
		err = nil
	case n > 0 && err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	return n, err
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

// blockSize grows the block size for objects that would need more than
// Azure's 50,000 blocks, rounded up to a whole MiB.
func (s *Store) blockSize(size int64) int64 {
	b := s.opts.BlockSize
	if size > b*maxBlocks {
		b = (size/maxBlocks + 1 + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return b
}

// access turns PutOptions into Azure's conditions on the blob's ETag.
func access(opts cloud.PutOptions) *blob.AccessConditions {
	mc := &blob.ModifiedAccessConditions{}
	switch {
	case opts.IfAbsent:
		mc.IfNoneMatch = to.Ptr(azcore.ETagAny)
	case opts.IfVersion != "":
		mc.IfMatch = to.Ptr(azcore.ETag(`"` + opts.IfVersion + `"`))
	default:
		return nil
	}
	return &blob.AccessConditions{ModifiedAccessConditions: mc}
}

// putBlob sends body in one Put Blob (attempts: failed says whether body
// may still be read).
func (s *Store) putBlob(ctx context.Context, name string, body []byte, opts cloud.PutOptions) (failed bool, err error) {
	bb := s.client.NewBlockBlobClient(name)
	failed, err = s.attempts(ctx, func(ctx context.Context) error {
		_, err := bb.Upload(ctx, streaming.NopCloser(bytes.NewReader(body)), &blockblob.UploadOptions{AccessConditions: access(opts)})
		return err
	})
	if err != nil {
		return failed, fmt.Errorf("put %s: %w", name, s.translate(err))
	}
	return failed, nil
}

// upload is one staged-block upload: its block IDs share a random prefix,
// so that two writers of one name never mix blocks, and its commit can be
// recognised (commit).
type upload struct {
	s    *Store
	bb   *blockblob.Client
	name string
	tag  [12]byte
	mu   sync.Mutex
	ids  []string // by block number, filled as blocks are staged
}

func (s *Store) newUpload(name string) (*upload, error) {
	u := &upload{s: s, bb: s.client.NewBlockBlobClient(name), name: name}
	if _, err := rand.Read(u.tag[:]); err != nil {
		return nil, err
	}
	return u, nil
}

// blockID is block num's ID: base64 of the upload's tag and the number,
// 16 bytes, so every ID of the blob has the same length (Azure's rule).
func (u *upload) blockID(num int) string {
	b := binary.BigEndian.AppendUint32(u.tag[:], uint32(num))
	return base64.StdEncoding.EncodeToString(b)
}

// send stages first (a full block, or the whole object when last) and
// then r block by block, Concurrency blocks at a time. send owns first.
func (u *upload) send(ctx context.Context, first []byte, last bool, r io.Reader, block int64) (int64, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(u.s.opts.Concurrency)
	total := int64(len(first))
	buf := first
	for num := 0; ; num++ {
		if num >= maxBlocks {
			u.s.pool.put(buf)
			g.Go(func() error { return errors.New("more than 50000 blocks") })
			break
		}
		if len(buf) == 0 { // an empty conditional write: commit no blocks
			u.s.pool.put(buf)
			break
		}
		body, n := buf, num
		g.Go(func() error {
			failed, err := u.stage(gctx, n, body)
			if failed {
				u.s.pool.drop(body)
			} else {
				u.s.pool.put(body)
			}
			return err
		})
		if last {
			break
		}
		var err error
		if buf, err = u.s.pool.get(gctx, block); err != nil {
			g.Go(func() error { return err })
			break
		}
		var m int
		m, err = fill(cloud.ContextReader(gctx, r), buf)
		total += int64(m)
		if m == 0 && errors.Is(err, io.EOF) {
			u.s.pool.put(buf)
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			buf, last = buf[:m], true
			continue
		}
		if err != nil {
			u.s.pool.put(buf)
			g.Go(func() error { return fmt.Errorf("read: %w", err) })
			break
		}
	}
	return total, g.Wait()
}

// stage uploads block num from body (attempts: failed says whether body
// may still be read).
func (u *upload) stage(ctx context.Context, num int, body []byte) (failed bool, err error) {
	id := u.blockID(num)
	failed, err = u.s.attempts(ctx, func(ctx context.Context) error {
		_, err := u.bb.StageBlock(ctx, id, streaming.NopCloser(bytes.NewReader(body)), nil)
		return err
	})
	if err != nil {
		return failed, fmt.Errorf("block %d: %w", num, u.s.translate(err))
	}
	u.mu.Lock()
	if len(u.ids) <= num {
		u.ids = append(u.ids, make([]string, num+1-len(u.ids))...)
	}
	u.ids[num] = id
	u.mu.Unlock()
	return failed, nil
}

// commit makes the staged blocks the blob, under opts' conditions. A
// conditional commit that the SDK retried after a lost answer meets its
// own write and fails its condition; commit recognises that case by the
// blob's committed blocks (IDs no other writer uses) and reports success,
// so a writer that won a lease or latest.json is not told it lost.
func (u *upload) commit(ctx context.Context, opts cloud.PutOptions) error {
	_, err := u.s.attempts(ctx, func(ctx context.Context) error {
		_, err := u.bb.CommitBlockList(ctx, u.ids, &blockblob.CommitBlockListOptions{AccessConditions: access(opts)})
		return err
	})
	if err == nil {
		return nil
	}
	err = u.s.translate(err)
	if errors.Is(err, cloud.ErrPrecondition) && len(u.ids) > 0 && u.committed(ctx) {
		u.s.log.Info("commit answered precondition failed after its own retry; the blob holds this upload's blocks",
			zap.String("key", u.name))
		return nil
	}
	return fmt.Errorf("commit block list: %w", err)
}

// committed reports whether the blob's committed blocks are this upload's.
func (u *upload) committed(ctx context.Context) bool {
	resp, err := u.bb.GetBlockList(ctx, blockblob.BlockListTypeCommitted, nil)
	if err != nil || resp.BlockList.CommittedBlocks == nil {
		return false
	}
	got := make([]string, 0, len(resp.BlockList.CommittedBlocks))
	for _, b := range resp.BlockList.CommittedBlocks {
		if b.Name != nil {
			got = append(got, *b.Name)
		}
	}
	return slices.Equal(got, u.ids)
}
