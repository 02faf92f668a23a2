package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// Checksums. A manifest records one checksum per file, taken while the
// file is uploaded: CRC32C (Castagnoli), the checksum GCS keeps for every
// object and S3 verifies on every part and, for multipart objects, on the
// whole object (full-object CRC32C). With SSE4.2 it costs ~0.04 core-s per
// GiB where sha256 cost ~0.6 (docs/storage.md, "Checksums"). Manifests
// written before it carry sha256 instead; restore verifies whichever the
// manifest has.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// newCRC32C returns a CRC32C hash (hardware accelerated where the CPU has
// it: SSE4.2 on amd64, CRC32 instructions on arm64).
func newCRC32C() hash.Hash32 { return crc32.New(castagnoli) }

// CRC32CHex is how a manifest writes a CRC32C: 8 lowercase hex digits,
// big-endian (the byte order of S3's and GCS's base64 form).
func CRC32CHex(v uint32) string { return fmt.Sprintf("%08x", v) }

// digest returns a fresh hash of the kind f's manifest entry records, the
// value it must produce (hex), and its name for messages.
func (f File) digest() (h hash.Hash, want, name string) {
	if f.CRC32C != "" {
		return newCRC32C(), f.CRC32C, "crc32c"
	}
	return sha256.New(), f.SHA256, "sha256"
}

// Verify reads r to its end and checks it against f: the size, and the
// checksum the manifest records (CRC32C, or sha256 in older manifests).
// A mismatch wraps ErrCorrupt.
func (f File) Verify(r io.Reader) error {
	h, want, name := f.digest()
	n, err := io.Copy(h, io.LimitReader(r, f.Size+1))
	if err != nil {
		return err
	}
	if n != f.Size {
		return sizeMismatch(n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s %s, manifest says %s", ErrCorrupt, name, got, want)
	}
	return nil
}

// sameContent reports whether a and b record the same content: the same
// size and checksum (of the same kind).
func (f File) sameContent(g File) bool {
	return f.Size == g.Size && f.CRC32C == g.CRC32C && f.SHA256 == g.SHA256
}
