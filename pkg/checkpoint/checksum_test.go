package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestChecksum_Validate(t *testing.T) {
	ok := File{Path: "m", Key: "k/m", Size: 1, CRC32C: "0badf00d"}
	for _, c := range []struct {
		name string
		edit func(*File)
		bad  bool
	}{
		{"crc32c", func(*File) {}, false},
		{"both", func(f *File) { f.SHA256 = strings.Repeat("ab", 32) }, false},
		{"sha256 only", func(f *File) { f.CRC32C, f.SHA256 = "", strings.Repeat("ab", 32) }, false},
		{"none", func(f *File) { f.CRC32C = "" }, true},
		{"short crc32c", func(f *File) { f.CRC32C = "0badf00" }, true},
		{"upper case crc32c", func(f *File) { f.CRC32C = "0BADF00D" }, true},
		{"bad sha256 beside crc32c", func(f *File) { f.SHA256 = "x" }, true},
	} {
		f := ok
		c.edit(&f)
		m := Manifest{Format: Format, ID: "a", Step: 1, Files: []File{f}}
		if err := m.Validate(); (err != nil) != c.bad {
			t.Errorf("%s: Validate = %v, want error %v", c.name, err, c.bad)
		}
	}
	if err := (File{Size: 3, CRC32C: CRC32CHex(crc32.Checksum([]byte("abc"), castagnoli))}).Verify(strings.NewReader("abcd")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify of a longer object = %v, want ErrCorrupt", err)
	}
}

func TestCRC32CCombine(t *testing.T) {
	data := []byte(strings.Repeat("spot checkpoint bytes ", 5000))
	for _, cut := range []int{0, 1, 7, 4096, len(data) - 1, len(data)} {
		a, b := data[:cut], data[cut:]
		got := crc32cCombine(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), int64(len(b)))
		if want := crc32.Checksum(data, castagnoli); got != want {
			t.Fatalf("cut %d: combined %08x, want %08x", cut, got, want)
		}
	}
	// Out-of-order ranged writes, each range in several writes.
	var sink writerAtDiscard
	cw := NewCRCWriterAt(sink)
	for _, r := range [][2]int{{60000, len(data)}, {0, 30000}, {30000, 60000}} {
		for off := r[0]; off < r[1]; off += 777 {
			end := min(off+777, r[1])
			cw.WriteAt(data[off:end], int64(off))
		}
	}
	if crc, ok := cw.Sum(int64(len(data))); !ok || crc != crc32.Checksum(data, castagnoli) {
		t.Fatalf("sum = %08x, %v; want %08x, true", crc, ok, crc32.Checksum(data, castagnoli))
	}
	cw.WriteAt(data[:10], 0) // a range written twice: not trusted
	if _, ok := cw.Sum(int64(len(data))); ok {
		t.Fatal("overlapping writes summed as ok")
	}
}

type writerAtDiscard struct{}

func (writerAtDiscard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// CopyVerified writes what it reads and accepts exactly f's bytes: across
// its buffer's size, read by read, with and without a Progress; a short,
// long or different body, a failing reader or a failing writer, is an
// error.
func TestCopyVerified(t *testing.T) {
	content := make([]byte, 3<<20+12345) // three buffers and a bit
	for i := range content {
		content[i] = byte(i * 31)
	}
	f := File{Path: "w.bin", Size: int64(len(content)), CRC32C: fmt.Sprintf("%08x", crc32.Checksum(content, crc32.MakeTable(crc32.Castagnoli)))}
	// Each read is hashed and written as it comes: short reads, and a
	// last read that brings io.EOF with its bytes, lose nothing.
	readers := []func(io.Reader) io.Reader{iotest.HalfReader, iotest.DataErrReader}
	for i, p := range []*Progress{nil, {}, nil, {}} {
		var out bytes.Buffer
		if err := CopyVerified(&out, readers[i/2](bytes.NewReader(content)), f, p); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), content) {
			t.Fatal("written bytes differ")
		}
		if p != nil && p.Done() != f.Size {
			t.Fatalf("progress %d, want %d", p.Done(), f.Size)
		}
	}
	// Short reads (a TLS body's 16 KiB records) are gathered into writes
	// of at least 64 KiB, the last one aside.
	var sizes writeSizes
	if err := CopyVerified(&sizes, &chunkReader{content, 16 << 10}, f, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sizes.out.Bytes(), content) {
		t.Fatal("written bytes differ (16 KiB reads)")
	}
	for i, n := range sizes.n[:len(sizes.n)-1] {
		if n < 64<<10 {
			t.Fatalf("write %d of %d: %d bytes, want at least 64 KiB", i, len(sizes.n), n)
		}
	}
	bad := bytes.Clone(content)
	bad[2<<20] ^= 1
	for name, c := range map[string]struct {
		body []byte
		want error
	}{
		"short": {content[:len(content)-1], nil}, "long": {append(bytes.Clone(content), 0), nil}, "changed": {bad, ErrCorrupt},
	} {
		err := CopyVerified(io.Discard, bytes.NewReader(c.body), f, nil)
		if err == nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want an error (%v)", name, err, c.want)
		}
	}
	// A body cut off by an error (a peer reset, a stall) is that error.
	if err := CopyVerified(io.Discard, iotest.TimeoutReader(bytes.NewReader(content)), f, nil); !errors.Is(err, iotest.ErrTimeout) {
		t.Errorf("failing reader: %v, want %v", err, iotest.ErrTimeout)
	}
	wantErr := errors.New("disk full")
	if err := CopyVerified(failWriter{wantErr}, bytes.NewReader(content), f, nil); !errors.Is(err, wantErr) {
		t.Errorf("failing writer: %v, want %v", err, wantErr)
	}
}

// chunkReader returns at most n bytes a read.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// writeSizes keeps what is written and the size of each write.
type writeSizes struct {
	out bytes.Buffer
	n   []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.n = append(w.n, len(p))
	return w.out.Write(p)
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }
