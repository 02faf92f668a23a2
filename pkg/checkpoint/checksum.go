package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sort"
	"sync"

	"github.com/zeebo/blake3"
)

// Checksums. A manifest records one checksum per file, taken while the
// file is uploaded: CRC32C (Castagnoli), the checksum GCS keeps for every
// object and S3 verifies on every part and, for multipart objects, on the
// whole object (full-object CRC32C). With SSE4.2 it costs ~0.04 core-s per
// GiB where sha256 cost ~0.6 (docs/storage.md, "Checksums"). Manifests
// written before it carry sha256 instead; a store download verifies
// whichever the manifest has.
//
// Four bytes forge a CRC: other bytes of the same size and CRC32C are
// easy to make. So since #46 the manifest also records a digest, BLAKE3,
// taken in the same pass, and a copy nearer than the store (the local
// tier, a peer, a replica, a reused restore directory) is used only once
// its bytes match it (VerifyDigest, CopyDigestVerified). BLAKE3 rather
// than sha256: on this project's 2-core AMD EPYC (SHA-NI, AVX-512), alone
// over 256 KiB chunks, sha256 took 0.69-0.75 core-s per GiB, BLAKE3
// (github.com/zeebo/blake3) 0.36-0.38 and CRC32C 0.05 (spotbench -only
// digest). A file whose entry has no digest (a CRC-only manifest) is read
// from the store only; the sha256 of pre-CRC manifests counts as a digest.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewCRC32C returns a CRC32C hash (hardware accelerated where the CPU has
// it: SSE4.2 on amd64, CRC32 instructions on arm64).
func NewCRC32C() hash.Hash32 { return crc32.New(castagnoli) }

// CRC32CHex is how a manifest writes a CRC32C: 8 lowercase hex digits,
// big-endian (the byte order of S3's and GCS's base64 form).
func CRC32CHex(v uint32) string { return fmt.Sprintf("%08x", v) }

// Digest returns a fresh hash of the kind f's manifest entry records, the
// value it must produce (hex), and its name for messages.
func (f File) Digest() (h hash.Hash, want, name string) {
	if f.CRC32C != "" {
		return NewCRC32C(), f.CRC32C, "crc32c"
	}
	return sha256.New(), f.SHA256, "sha256"
}

// NewDigest returns a fresh hash of the digest this version records:
// BLAKE3-256.
func NewDigest() hash.Hash { return blake3.New() }

// ErrNoDigest means f's manifest entry records no digest (a manifest
// written before #46, with CRC32C only): only the store's copy of it may
// be used.
var ErrNoDigest = errors.New("manifest records no digest for the file")

// HasDigest reports whether f records a cryptographic digest a nearby
// copy can be checked against: BLAKE3, or the sha256 of a manifest from
// before CRC32C.
func (f File) HasDigest() bool { return f.BLAKE3 != "" || f.SHA256 != "" }

// strong returns a fresh hash of f's digest, the value it must produce and
// its name; h is nil when f records none.
func (f File) strong() (h hash.Hash, want, name string) {
	switch {
	case f.BLAKE3 != "":
		return NewDigest(), f.BLAKE3, "blake3"
	case f.SHA256 != "":
		return sha256.New(), f.SHA256, "sha256"
	}
	return nil, "", ""
}

// Verify reads r to its end and checks it against f: the size, and the
// checksum the manifest records (CRC32C, or sha256 in older manifests):
// a store download's check. A mismatch wraps ErrCorrupt.
func (f File) Verify(r io.Reader) error {
	h, want, name := f.Digest()
	return verify(r, f.Size, h, want, name)
}

// VerifyDigest reads r to its end and checks it against f's size and
// digest: a nearby copy's check, which other bytes of the same CRC32C
// fail. ErrNoDigest when f records none; a mismatch wraps ErrCorrupt.
func (f File) VerifyDigest(r io.Reader) error {
	h, want, name := f.strong()
	if h == nil {
		return fmt.Errorf("%s: %w", f.Path, ErrNoDigest)
	}
	return verify(r, f.Size, h, want, name)
}

func verify(r io.Reader, size int64, h hash.Hash, want, name string) error {
	n, err := io.Copy(h, io.LimitReader(r, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return SizeMismatch(n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s %s, manifest says %s", ErrCorrupt, name, got, want)
	}
	return nil
}

// SameContent reports whether a and b record the same content: the same
// size and checksum (of the same kind).
func (f File) SameContent(g File) bool {
	return f.Size == g.Size && f.CRC32C == g.CRC32C && f.SHA256 == g.SHA256 && f.BLAKE3 == g.BLAKE3
}

// Sums takes a file's CRC32C and digest in one pass: each write is hashed
// by both while it is in the CPU's cache (CountingReader hands it
// hashChunk bytes at a time).
type Sums struct {
	crc hash.Hash32
	dig hash.Hash
	n   int64
}

// NewSums returns empty Sums.
func NewSums() *Sums { return &Sums{crc: NewCRC32C(), dig: NewDigest()} }

func (s *Sums) Write(p []byte) (int, error) {
	s.crc.Write(p)
	s.dig.Write(p)
	s.n += int64(len(p))
	return len(p), nil
}

// Len is the bytes written.
func (s *Sums) Len() int64 { return s.n }

// CRC32C is the CRC32C of what was written, as a manifest writes it.
func (s *Sums) CRC32C() string { return CRC32CHex(s.crc.Sum32()) }

// Digest is the digest of what was written, as a manifest writes it.
func (s *Sums) Digest() string { return hex.EncodeToString(s.dig.Sum(nil)) }

// crc32cCombine returns the CRC32C of A followed by B from crcA, crcB and
// the length of B (zlib's crc32_combine, for the Castagnoli polynomial):
// the CRC of an object downloaded in ranges, from the ranges' CRCs.
func crc32cCombine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	var even, odd [32]uint32
	odd[0] = 0x82f63b78 // Castagnoli, reflected
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // the operator for two zero bits
	gf2Square(&odd, &even) // four
	for {
		gf2Square(&even, &odd) // one zero byte, then 4, 16, ...
		if lenB&1 != 0 {
			crcA = gf2Times(&even, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
		gf2Square(&odd, &even)
		if lenB&1 != 0 {
			crcA = gf2Times(&odd, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}

// CRCWriterAt takes the CRC32C of what is written through it at any
// offsets, as runs of contiguous writes (a ranged download writes each
// range in order, several ranges at once): the file's CRC32C without
// reading it back.
type CRCWriterAt struct {
	w    io.WriterAt
	mu   sync.Mutex
	runs map[int64]*crcRun // by end offset
}

type crcRun struct {
	off, n int64
	crc    uint32
}

// NewCRCWriterAt wraps w, taking the CRC32C of each range written (Sum).
func NewCRCWriterAt(w io.WriterAt) *CRCWriterAt {
	return &CRCWriterAt{w: w, runs: map[int64]*crcRun{}}
}

func (c *CRCWriterAt) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.w.WriteAt(p, off)
	if n > 0 {
		c.mu.Lock()
		r := c.runs[off]
		if r == nil {
			r = &crcRun{off: off}
		} else {
			delete(c.runs, off)
		}
		r.crc = crc32.Update(r.crc, castagnoli, p[:n])
		r.n += int64(n)
		c.runs[r.off+r.n] = r
		c.mu.Unlock()
	}
	return n, err
}

// Sum is the CRC32C of [0, size) if the writes covered exactly that, each
// byte once; ok is false otherwise (a range written twice, a gap).
func (c *CRCWriterAt) Sum(size int64) (crc uint32, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	runs := make([]*crcRun, 0, len(c.runs))
	for _, r := range c.runs {
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].off < runs[j].off })
	var at int64
	for _, r := range runs {
		if r.off != at {
			return 0, false
		}
		crc = crc32cCombine(crc, r.crc, r.n)
		at += r.n
	}
	return crc, at == size
}

// ErrCorrupt marks an object whose size or checksum differs from its manifest.
var ErrCorrupt = errors.New("checkpoint damaged")

// SizeMismatch is the ErrCorrupt of an object of size got whose manifest
// says want.
func SizeMismatch(got, want int64) error {
	return fmt.Errorf("%w: size %d, manifest says %d", ErrCorrupt, got, want)
}

// CopyVerified copies f's content from r to w, counting it into p, and
// checks its size (at most f.Size+1 bytes are read) and checksum against
// f as it goes: the caller's copy is what the manifest says, or an error.
// The checksum is the store's transfer check (CRC32C, or an old
// manifest's sha256); a nearby copy is checked by CopyDigestVerified.
func CopyVerified(w io.Writer, r io.Reader, f File, p *Progress) error {
	h, want, name := f.Digest()
	return copyChecked(w, r, f, p, h, want, name)
}

// CopyDigestVerified is CopyVerified against f's digest: how a copy nearer
// than the store (local tier, peer, replica) is read. ErrNoDigest, reading
// nothing, when f records none; a mismatch wraps ErrCorrupt, and the
// caller must discard what was written.
func CopyDigestVerified(w io.Writer, r io.Reader, f File, p *Progress) error {
	h, want, name := f.strong()
	if h == nil {
		return fmt.Errorf("%s: %w", f.Path, ErrNoDigest)
	}
	return copyChecked(w, r, f, p, h, want, name)
}

func copyChecked(w io.Writer, r io.Reader, f File, p *Progress, h hash.Hash, want, name string) error {
	lr := io.LimitReader(r, f.Size+1)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		// Each read is hashed as it lands and written once minWrite
		// bytes are in: filling buf first (io.ReadFull) takes many short
		// reads once the reader is ahead of the socket, each parking
		// until more comes, and the bytes leave the CPU's cache.
		n := 0
		var err error
		for n < minWrite && err == nil {
			var m int
			m, err = lr.Read(buf[n:])
			for off := n; off < n+m; off += hashChunk {
				h.Write(buf[off:min(off+hashChunk, n+m)])
			}
			n += m
		}
		if n > 0 {
			total += int64(n)
			if p != nil {
				p.Add(n)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if total != f.Size {
		return SizeMismatch(total, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: %s %s, manifest says %s", ErrCorrupt, name, got, want)
	}
	return nil
}

// copyBufs are CopyVerified's buffers. Each read (up to 1 MiB, straight
// from the socket past an HTTP client's 256 KiB read buffer) is hashed in
// hashChunk steps as it lands and written at once, or with the next reads
// while fewer than minWrite bytes are in: against io.Copy into the
// *os.File (32 KiB reads through that buffer, one copy more, and 32 KiB
// writes), a peer transfer into a verified file went from 600–690 to
// 840–1,140 MiB/s on a shared 2-core loopback (BenchmarkTransfer,
// peertier). Filling the whole buffer before writing it cost the receiver
// 1.8–2.5 CPU-s per GiB between two network namespaces on a loaded
// machine (perf: the write's copy into the page cache, 10× the cost of the
// same bytes written as they came), against 0.7–0.85 read by read, as a
// plain TCP stream into a file costs (spotbench -only peernet).
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// minWrite gathers short reads (a TLS body's 16 KiB records) into one
// write: written one by one they cost twice the CPU of 1 MiB writes; in
// 64 KiB, a tenth more. A socket read of a fast stream brings more.
const minWrite = 64 << 10
