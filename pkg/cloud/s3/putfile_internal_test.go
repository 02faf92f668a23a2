package s3

import (
	"bytes"
	"hash/crc32"
	"io"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
)

// A file source is uploaded from the file itself (no Read), part by part,
// and reads back the same; the CRC32C reported is the whole object's.
func TestPutFile(t *testing.T) {
	srv := s3test.New(t)
	st, err := New(t.Context(), srv.Bucket, "files", Options{PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 1000, 5 << 20, 12<<20 + 7} {
		data, src := cloudtest.RandomFile(t, size)
		if err := st.Put(t.Context(), "obj", src, int64(size), cloud.PutOptions{}); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if !src.Reported || src.N != int64(size) || src.CRC != crc32.Checksum(data, castagnoli) {
			t.Fatalf("size %d: Sent(%d, %08x) called %v, want %d, %08x", size, src.N, src.CRC, src.Reported, size, crc32.Checksum(data, castagnoli))
		}
		// The bytes read to checksum it, each once, in order: the
		// committer's digest is taken from them (cloud.ScannedSource).
		if !bytes.Equal(src.Scans, data) {
			t.Fatalf("size %d: Scanned saw %d bytes, equal to the file %v", size, len(src.Scans), bytes.Equal(src.Scans, data))
		}
		// A multipart upload reports each part as it is sent (#41 item 5):
		// a long upload's progress moves, instead of jumping at Sent.
		var sum int64
		for _, n := range src.Reports {
			sum += n
		}
		if wantParts := (size + 5<<20 - 1) / (5 << 20); size > 5<<20 && (len(src.Reports) != wantParts || sum != int64(size)) {
			t.Fatalf("size %d: progress %v, want %d parts adding to the size", size, src.Reports, wantParts)
		}
		r, err := st.Get(t.Context(), "obj", 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("size %d: read back %d bytes (err %v), equal %v", size, len(got), err, bytes.Equal(got, data))
		}
	}
}
