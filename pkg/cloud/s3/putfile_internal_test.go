package s3

import (
	"bytes"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
)

type testSource struct {
	io.Reader
	f    *os.File
	size int64
	n    int64
	crc  uint32
	sent bool
}

func (s *testSource) SourceFile() (*os.File, int64) { return s.f, s.size }
func (s *testSource) Sent(n int64, crc uint32)      { s.n, s.crc, s.sent = n, crc, true }

// A file source is uploaded from the file itself (no Read), part by part,
// and reads back the same; the CRC32C reported is the whole object's.
func TestPutFile(t *testing.T) {
	srv := s3test.New(t)
	st, err := New(t.Context(), srv.Bucket, "files", Options{PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 1000, 5 << 20, 12<<20 + 7} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rand.Uint32())
		}
		p := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src := &testSource{Reader: iotestErr{}, f: f, size: int64(size)}
		if err := st.Put(t.Context(), "obj", src, int64(size), cloud.PutOptions{}); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if !src.sent || src.n != int64(size) || src.crc != crc32.Checksum(data, castagnoli) {
			t.Fatalf("size %d: Sent(%d, %08x) called %v, want %d, %08x", size, src.n, src.crc, src.sent, size, crc32.Checksum(data, castagnoli))
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

// iotestErr fails every Read: the file path must not read the source.
type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, io.ErrClosedPipe }
