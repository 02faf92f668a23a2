package cloudtest

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// FileSource is a cloud.FileSource over an open file, for a backend's own
// tests: Read fails (a backend given a file source must send the file
// itself), and Sent records what the backend reported.
type FileSource struct {
	F        *os.File
	Size     int64
	N        int64   // the bytes Sent reported
	CRC      uint32  // and their CRC32C
	Reported bool    // Sent was called
	Reports  []int64 // what each call to Progress reported
	Scans    []byte  // what the backend showed Scanned, in order (cloud.ScannedSource)
	mu       sync.Mutex
}

// Scanned records the bytes a store read to checksum the file.
func (s *FileSource) Scanned(p []byte) { s.mu.Lock(); s.Scans = append(s.Scans, p...); s.mu.Unlock() }

// Progress records a store's progress report (cloud.ProgressSource).
func (s *FileSource) Progress(n int64) { s.mu.Lock(); s.Reports = append(s.Reports, n); s.mu.Unlock() }

func (s *FileSource) Read([]byte) (int, error) {
	return 0, errors.New("cloudtest: a file source must not be read")
}
func (s *FileSource) SourceFile() (*os.File, int64) { return s.F, s.Size }
func (s *FileSource) Sent(n int64, crc uint32)      { s.N, s.CRC, s.Reported = n, crc, true }

// RandomFile writes size random bytes to a new file under t.TempDir and
// returns them, with the file open for reading as a FileSource (closed
// when the test ends).
func RandomFile(t testing.TB, size int) ([]byte, *FileSource) {
	t.Helper()
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
	t.Cleanup(func() { f.Close() })
	return data, &FileSource{F: f, Size: int64(size)}
}
