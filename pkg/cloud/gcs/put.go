package gcs

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"

	"cloud.google.com/go/storage"

	"github.com/spotagent/spotagent/pkg/cloud"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Put streams r through a resumable upload. The library computes the
// object's CRC32C while streaming and sends it with the final request, so
// the server rejects a corrupted object; Put also checks the CRC32C the
// server reports against its own. On any error the writer's context is
// cancelled, which abandons the upload: no object appears.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	o, err := s.object(key)
	if err != nil {
		return err
	}
	if o, err = conditional(putRetries(ctx, o), opts); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if src, ok := r.(cloud.FileSource); ok && size >= 0 && size <= singleMax {
		if _, fsize := src.SourceFile(); fsize == size {
			return s.putFile(ctx, o, key, src)
		}
	}
	chunk := s.opts.ChunkSize
	if size >= 0 && size < int64(chunk) {
		// One request, and a buffer no larger than the object.
		chunk = roundUp(int(size)+1, chunkQuantum)
	}
	if err := s.mem.Acquire(ctx, int64(chunk)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer s.mem.Release(int64(chunk))

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := o.NewWriter(wctx)
	w.ChunkSize = chunk
	w.ContentType = "application/octet-stream"
	sum := crc32.New(castagnoli)
	n, err := io.Copy(w, io.TeeReader(cloud.ContextReader(ctx, r), sum))
	if err == nil && size >= 0 && n != size {
		err = fmt.Errorf("read %d bytes, want %d", n, size)
	}
	if err != nil {
		cancel()
		_ = w.Close()
		return fmt.Errorf("put %s: %w", key, translate(err))
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, translate(err))
	}
	if got := w.Attrs().CRC32C; got != sum.Sum32() {
		return fmt.Errorf("put %s: server crc32c %08x, sent %08x", key, got, sum.Sum32())
	}
	return nil
}

func conditional(o *storage.ObjectHandle, opts cloud.PutOptions) (*storage.ObjectHandle, error) {
	switch {
	case opts.IfAbsent:
		return o.If(storage.Conditions{DoesNotExist: true}), nil
	case opts.IfVersion != "":
		gen, err := strconv.ParseInt(opts.IfVersion, 10, 64)
		if err != nil || gen <= 0 {
			return nil, cloud.ErrPrecondition // no object has that version
		}
		return o.If(storage.Conditions{GenerationMatch: gen}), nil
	}
	return o, nil
}
