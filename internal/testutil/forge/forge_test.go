package forge

import (
	"bytes"
	"hash/crc32"
	"testing"
)

func TestLikeKeepsSizeAndCRC32C(t *testing.T) {
	genuine := bytes.Repeat([]byte("GOOD-WEIGHTS "), 1000)
	fake, err := Like(genuine, []byte("EVIL-WEIGHTS-FROM-MITM"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fake) != len(genuine) {
		t.Fatalf("len %d, want %d", len(fake), len(genuine))
	}
	if !bytes.HasPrefix(fake, []byte("EVIL-WEIGHTS-FROM-MITM")) {
		t.Fatalf("fake lost its content: %q", fake[:22])
	}
	if bytes.Equal(fake, genuine) {
		t.Fatal("fake equals genuine")
	}
	if a, b := crc32.Checksum(fake, castagnoli), crc32.Checksum(genuine, castagnoli); a != b {
		t.Fatalf("crc32c %08x, want %08x", a, b)
	}
}

func TestCRC32CAnyOffset(t *testing.T) {
	data := []byte("0123456789abcdef0123456789abcdef")
	for at := 0; at+4 <= len(data); at += 5 {
		out, err := CRC32C(data, at, 0xdeadbeef)
		if err != nil {
			t.Fatalf("at %d: %v", at, err)
		}
		if got := crc32.Checksum(out, castagnoli); got != 0xdeadbeef {
			t.Fatalf("at %d: %08x", at, got)
		}
	}
	if _, err := Like([]byte("abc"), nil); err == nil {
		t.Fatal("3 bytes forged")
	}
}
