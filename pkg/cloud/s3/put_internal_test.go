package s3

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// fill must read exactly like io.ReadFull (the upload loop relies on its
// EOF and ErrUnexpectedEOF) and return the CRC32C of the bytes it read.
func TestFill(t *testing.T) {
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	boom := errors.New("boom")
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(data) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
		"error":    func() io.Reader { return io.MultiReader(bytes.NewReader(data[:300]), iotest.ErrReader(boom)) },
		// An error that wraps EOF is an error, not the end (io.ReadFull agrees).
		"wrapped EOF": func() io.Reader {
			return io.MultiReader(bytes.NewReader(data[:300]), iotest.ErrReader(fmt.Errorf("truncated: %w", io.EOF)))
		},
	}
	for name, mk := range readers {
		for _, size := range []int{0, 1, 300, 999, 1000, 1001, 4096} {
			want := make([]byte, size)
			wn, werr := io.ReadFull(mk(), want)
			got := make([]byte, size)
			n, crc, err := fill(mk(), got)
			if n != wn || fmt.Sprint(err) != fmt.Sprint(werr) {
				t.Errorf("%s, buf %d: fill = %d, %v; io.ReadFull = %d, %v", name, size, n, err, wn, werr)
				continue
			}
			if !bytes.Equal(got[:n], want[:wn]) {
				t.Errorf("%s, buf %d: bytes differ from io.ReadFull's", name, size)
			}
			if w := crc32.Checksum(got[:n], castagnoli); crc != w {
				t.Errorf("%s, buf %d: crc %08x, want %08x", name, size, crc, w)
			}
		}
	}
}

func TestChecksumEncoding(t *testing.T) {
	// CRC-32C check value (RFC 3720, B.4): "123456789" → 0xE3069283.
	if got := *checksum(crc32.Checksum([]byte("123456789"), castagnoli)); got != "4waSgw==" {
		t.Fatalf("checksum = %q, want 4waSgw==", got)
	}
}
