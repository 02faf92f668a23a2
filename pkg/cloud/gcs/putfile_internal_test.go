package gcs

import (
	"bytes"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/pkg/cloud"
)

type testSource struct {
	f    *os.File
	size int64
	n    int64
	crc  uint32
	sent bool
}

func (s *testSource) Read([]byte) (int, error)      { return 0, io.ErrClosedPipe } // must not be read
func (s *testSource) SourceFile() (*os.File, int64) { return s.f, s.size }
func (s *testSource) Sent(n int64, crc uint32)      { s.n, s.crc, s.sent = n, crc, true }

// A file goes in one request with its CRC32C, which the server checks:
// a wrong one leaves no object.
func TestPutFile_OneRequest(t *testing.T) {
	_, bucket := gcstest.NewServer(t)
	st, err := New(t.Context(), bucket, "files", Options{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	data := make([]byte, 3<<20+5) // several chunks: the chunked path would take 13 requests
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
	src := &testSource{f: f, size: int64(len(data))}
	if err := st.Put(t.Context(), "obj", src, src.size, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if want := crc32.Checksum(data, castagnoli); !src.sent || src.n != src.size || src.crc != want {
		t.Fatalf("Sent(%d, %08x) called %v, want %d, %08x", src.n, src.crc, src.sent, src.size, want)
	}
	r, err := st.Get(t.Context(), "obj", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), equal %v", len(got), err, bytes.Equal(got, data))
	}
	// The server checks the CRC32C sent with the request.
	o, _ := st.object("bad")
	if err := st.putOnce(t.Context(), o, bytes.NewReader(data), crc32.Checksum(data, castagnoli)^1); err == nil {
		t.Fatal("a wrong CRC32C was accepted")
	}
	if _, err := st.Stat(t.Context(), "bad"); err == nil {
		t.Fatal("an object with a wrong CRC32C was created")
	}
}
