package testutil

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePorts_BelowEphemeralAndFree(t *testing.T) {
	ps, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Fatalf("port %d twice in %v", p, ps)
		}
		seen[p] = true
		if lo := ephemeralLow(); lo > 11000 && p >= lo {
			t.Errorf("port %d is in the ephemeral range (from %d)", p, lo)
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		l.Close()
	}
}
