// Package forge makes bytes that a CRC32C cannot tell from the genuine
// ones: the attack a checkpoint's cryptographic digest exists to stop. Four
// bytes solve a CRC; tests use it to rewrite a local copy, a peer's response
// or a replica with other content of the same size and CRC32C.
package forge

import (
	"fmt"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns a copy of fake, of the same length, whose bytes at
// [at, at+4) are changed so that its CRC32C equals want. fake must hold at
// least at+4 bytes. The CRC is affine over GF(2): each of the 32 bits at
// that offset flips a fixed set of the checksum's bits, so 32 × 32 linear
// equations find the bits to set.
func CRC32C(fake []byte, at int, want uint32) ([]byte, error) {
	if at < 0 || at+4 > len(fake) {
		return nil, fmt.Errorf("forge: offset %d outside %d bytes", at, len(fake))
	}
	out := append([]byte(nil), fake...)
	clear(out[at : at+4])
	base := crc32.Checksum(out, castagnoli)
	// The effect of each bit: the tail after the patch is the same for
	// every bit, so only the CRC of the prefix with the bit set, carried
	// over the tail, differs. Computed plainly: len(out) is a test's size.
	var cols [32]uint32
	for i := range 32 {
		out[at+i/8] ^= 1 << (i % 8)
		cols[i] = crc32.Checksum(out, castagnoli) ^ base
		out[at+i/8] ^= 1 << (i % 8)
	}
	x, ok := solve(cols, base^want)
	if !ok {
		return nil, fmt.Errorf("forge: no 4-byte patch at offset %d", at)
	}
	for i := range 32 {
		if x&(1<<i) != 0 {
			out[at+i/8] ^= 1 << (i % 8)
		}
	}
	if got := crc32.Checksum(out, castagnoli); got != want {
		return nil, fmt.Errorf("forge: crc32c %08x, want %08x", got, want)
	}
	return out, nil
}

// Like returns fake made to the length and CRC32C of genuine: fake cut or
// zero-padded to len(genuine), then patched in its last four bytes.
func Like(genuine, fake []byte) ([]byte, error) {
	if len(genuine) < 4 {
		return nil, fmt.Errorf("forge: %d bytes: too short to forge", len(genuine))
	}
	out := make([]byte, len(genuine))
	copy(out, fake)
	return CRC32C(out, len(out)-4, crc32.Checksum(genuine, castagnoli))
}

// solve finds x with XOR of cols[i] for each bit i set in x equal to target
// (Gaussian elimination over GF(2)).
func solve(cols [32]uint32, target uint32) (uint32, bool) {
	// Rows are the checksum's bits; each row holds 32 coefficients and
	// the target's bit.
	type row struct{ coef, rhs uint32 }
	var rows [32]row
	for r := range 32 {
		for c := range 32 {
			if cols[c]&(1<<r) != 0 {
				rows[r].coef |= 1 << c
			}
		}
		rows[r].rhs = (target >> r) & 1
	}
	pivotRow := 0
	var pivots [32]int
	for i := range pivots {
		pivots[i] = -1
	}
	for c := 0; c < 32 && pivotRow < 32; c++ {
		p := -1
		for r := pivotRow; r < 32; r++ {
			if rows[r].coef&(1<<c) != 0 {
				p = r
				break
			}
		}
		if p < 0 {
			continue
		}
		rows[pivotRow], rows[p] = rows[p], rows[pivotRow]
		for r := range 32 {
			if r != pivotRow && rows[r].coef&(1<<c) != 0 {
				rows[r].coef ^= rows[pivotRow].coef
				rows[r].rhs ^= rows[pivotRow].rhs
			}
		}
		pivots[pivotRow] = c
		pivotRow++
	}
	var x uint32
	for r := range 32 {
		if rows[r].coef == 0 {
			if rows[r].rhs != 0 {
				return 0, false
			}
			continue
		}
		if pivots[r] >= 0 && rows[r].rhs != 0 {
			x |= 1 << pivots[r]
		}
	}
	return x, true
}
