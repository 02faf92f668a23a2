package all_test

import (
	"bytes"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// fileSource is a checkpoint file handed to Put the way the committer
// hands it (cloud.FileSource).
type fileSource struct {
	f       *os.File
	size    int64
	sent    bool
	crc     uint32
	sentLen int64
}

func (s *fileSource) Read(p []byte) (int, error)    { return s.f.Read(p) }
func (s *fileSource) SourceFile() (*os.File, int64) { return s.f, s.size }
func (s *fileSource) Sent(n int64, crc32c uint32)   { s.sent, s.sentLen, s.crc = true, n, crc32c }
func (s *fileSource) reset(t *testing.T)            { t.Helper(); s.f.Seek(0, io.SeekStart); s.sent = false }

var _ cloud.FileSource = (*fileSource)(nil)

// TestOpen_FileSourceReachesTheBackend: the layers all.Open puts around a
// backend (retry, log, metrics) hand Put's reader through unchanged, so
// S3 and GCS still send a checkpoint file straight from the file (one copy
// and one checksum pass less per byte). A wrapper that wrapped the reader
// would make them fall back to the buffered path silently; this fails then.
func TestOpen_FileSourceReachesTheBackend(t *testing.T) {
	data := bytes.Repeat([]byte("spotagent checkpoint bytes "), 40000) // ~1 MiB
	path := filepath.Join(t.TempDir(), "model.pt")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src := &fileSource{f: f, size: int64(len(data))}

	s3srv := s3test.New(t)
	_, bucket := gcstest.NewServer(t)
	for _, uri := range []string{"s3://" + s3srv.Bucket + "/runs/x", "gs://" + bucket + "/runs/x"} {
		st, err := all.Open(t.Context(), uri, all.Options{})
		if err != nil {
			t.Fatalf("open %s: %v", uri, err)
		}
		src.reset(t)
		if err := st.Put(t.Context(), "model.pt", src, src.size, cloud.PutOptions{}); err != nil {
			t.Fatalf("%s: put: %v", uri, err)
		}
		if !src.sent || src.sentLen != src.size || src.crc != crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)) {
			t.Fatalf("%s: the backend did not send from the file (Sent called %v, %d bytes, crc %08x)", uri, src.sent, src.sentLen, src.crc)
		}
		rc, err := st.Get(t.Context(), "model.pt", 0, -1)
		if err != nil {
			t.Fatalf("%s: get: %v", uri, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read back %d bytes, %v", uri, len(got), err)
		}
		st.Close()
	}
}
