package stream

import (
	"io"
	"strings"
	"testing"
)

// TestLoopback: 8 MiB cross a loopback stream, every byte counted, at a
// positive rate.
func TestLoopback(t *testing.T) {
	r, err := Loopback(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if r <= 0 {
		t.Fatalf("rate %v MiB/s, want > 0", r)
	}
}

func TestDiscard(t *testing.T) {
	n, err := io.CopyBuffer(Discard{}, strings.NewReader(strings.Repeat("x", 3000)), make([]byte, 1024))
	if n != 3000 || err != nil {
		t.Fatalf("copied %d, %v; want 3000, nil", n, err)
	}
}
