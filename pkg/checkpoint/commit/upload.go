package commit

import (
	"encoding/hex"
	"io"
	"os"
	"sync/atomic"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// uploadReader is what a commit hands to Store.Put for one file: a
// checkpoint.CountingReader taking the file's CRC32C as the store reads it, or, for a
// store that sends straight from the file (cloud.FileSource), the CRC32C
// that store took and had the server verify.
type uploadReader struct {
	checkpoint.CountingReader
	f          *os.File
	size       int64
	sent       bool
	crc        uint32
	progressed atomic.Int64 // what the store's Progress reported before Sent
}

var _ cloud.ProgressSource = (*uploadReader)(nil)

func newUploadReader(fh *os.File, size int64, p *checkpoint.Progress) *uploadReader {
	return &uploadReader{CountingReader: checkpoint.CountingReader{R: io.LimitReader(fh, size+1), H: checkpoint.NewCRC32C(), P: p}, f: fh, size: size}
}

func (u *uploadReader) SourceFile() (*os.File, int64) { return u.f, u.size }

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

// result is what was uploaded: its length and CRC32C (hex).
func (u *uploadReader) result() (int64, string) {
	if u.sent {
		return u.N, checkpoint.CRC32CHex(u.crc)
	}
	return u.N, hex.EncodeToString(u.H.Sum(nil))
}
