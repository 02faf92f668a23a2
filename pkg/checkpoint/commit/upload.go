package commit

import (
	"errors"
	"io"
	"os"
	"sync/atomic"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// uploadReader is what a commit hands to Store.Put for one file: a
// checkpoint.CountingReader taking the file's CRC32C and digest
// (checkpoint.Sums) as the store reads it, or, for a store that sends
// straight from the file (cloud.FileSource), the CRC32C that store took
// and had the server verify, and the digest of the bytes it read to take
// it (cloud.ScannedSource): either way the file is read once.
type uploadReader struct {
	checkpoint.CountingReader
	f          *os.File
	size       int64
	sums       *checkpoint.Sums // what Read passed
	scan       *checkpoint.Sums // what the store read to checksum it (Scanned)
	sent       bool
	crc        uint32
	progressed atomic.Int64 // what the store's Progress reported before Sent
}

var _ cloud.ProgressSource = (*uploadReader)(nil)
var _ cloud.ScannedSource = (*uploadReader)(nil)

func newUploadReader(fh *os.File, size int64, p *checkpoint.Progress) *uploadReader {
	sums := checkpoint.NewSums()
	return &uploadReader{CountingReader: checkpoint.CountingReader{R: io.LimitReader(fh, size+1), H: sums, P: p}, f: fh, size: size, sums: sums}
}

func (u *uploadReader) SourceFile() (*os.File, int64) { return u.f, u.size }

// Scanned takes the digest of the bytes the store checksums before it
// sends them, in order, once.
func (u *uploadReader) Scanned(p []byte) {
	if u.scan == nil {
		u.scan = checkpoint.NewSums()
	}
	u.scan.Write(p)
}

func (u *uploadReader) Sent(n int64, crc32c uint32) {
	u.sent, u.crc = true, crc32c
	u.N += n
	u.P.Add(int(n - u.progressed.Load())) // the rest, or less after a resent request
}

// Progress counts the bytes the store has sent so far (a part, a read of
// the request body), so that a long upload logs a steady progress.
func (u *uploadReader) Progress(n int64) {
	u.progressed.Add(n)
	u.P.Add(int(n))
}

// errChangedWhileSent: the file's bytes read for the digest are not those
// the store sent (it changed under the upload).
var errChangedWhileSent = errors.New("file changed while it was uploaded")

// result is what was uploaded: its length, CRC32C and digest (hex). A
// store that sent from the file without showing it every byte it read
// (Scanned) has the file read once more for the digest, whose CRC32C must
// then be the one the store sent.
func (u *uploadReader) result() (n int64, crc, digest string, err error) {
	if !u.sent {
		return u.N, u.sums.CRC32C(), u.sums.Digest(), nil
	}
	crc = checkpoint.CRC32CHex(u.crc)
	s := u.scan
	if s == nil || s.Len() != u.N || s.CRC32C() != crc {
		s = checkpoint.NewSums()
		if _, err := io.Copy(s, io.NewSectionReader(u.f, 0, u.size+1)); err != nil {
			return 0, "", "", err
		}
	}
	if s.Len() != u.N || s.CRC32C() != crc {
		return 0, "", "", errChangedWhileSent
	}
	return u.N, crc, s.Digest(), nil
}
