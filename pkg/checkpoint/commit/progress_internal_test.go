package commit

import (
	"errors"
	"os"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// A store's progress reports move the upload's progress as they come, and
// Sent adds only the rest: the total is the file, counted once (#41 item 5).
func TestUploadReader_ProgressThenSent(t *testing.T) {
	p := &checkpoint.Progress{Total: 30}
	u := newUploadReader(nil, 30, p)
	u.Progress(10)
	u.Progress(10)
	if got := p.Done(); got != 20 {
		t.Fatalf("after two parts: %d bytes, want 20", got)
	}
	data := make([]byte, 30)
	u.Scanned(data)
	h := checkpoint.NewCRC32C()
	h.Write(data)
	u.Sent(30, h.Sum32())
	if got := p.Done(); got != 30 {
		t.Fatalf("after Sent: %d bytes, want 30", got)
	}
	if n, _, _, err := u.result(); err != nil || n != 30 {
		t.Fatalf("result %d bytes (%v), want 30", n, err)
	}
}

// A store that sends from the file records the digest of the bytes it
// read to checksum them (Scanned); one that showed none has the file read
// once more, and a file whose bytes no longer have the CRC32C the store
// sent fails the upload.
func TestUploadReader_DigestOfSentBytes(t *testing.T) {
	data := []byte("the committed weights")
	crc := checkpoint.NewCRC32C()
	crc.Write(data)
	want := checkpoint.NewSums()
	want.Write(data)
	f, err := os.CreateTemp(t.TempDir(), "f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	for _, scanned := range []bool{true, false} {
		u := newUploadReader(f, int64(len(data)), &checkpoint.Progress{})
		if scanned {
			u.Scanned(data[:5])
			u.Scanned(data[5:])
		}
		u.Sent(int64(len(data)), crc.Sum32())
		n, c, d, err := u.result()
		if err != nil || n != int64(len(data)) || c != want.CRC32C() || d != want.Digest() {
			t.Fatalf("scanned=%v: %d %s %s %v, want %d %s %s", scanned, n, c, d, err, len(data), want.CRC32C(), want.Digest())
		}
	}
	u := newUploadReader(f, int64(len(data)), &checkpoint.Progress{})
	u.Sent(int64(len(data)), crc.Sum32()^1)
	if _, _, _, err := u.result(); !errors.Is(err, errChangedWhileSent) {
		t.Fatalf("crc of other bytes: %v, want errChangedWhileSent", err)
	}
}
