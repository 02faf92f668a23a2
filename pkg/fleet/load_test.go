package fleet

import (
	"testing"
	"time"
)

func TestParseSince(t *testing.T) {
	for _, s := range []string{"30x", "-1d", "NaN" + "d", "1e400d", "200000d", "-5h"} {
		if d, err := ParseSince(s); err == nil {
			t.Errorf("ParseSince(%q) = %v, want an error", s, d)
		}
	}
	for s, want := range map[string]time.Duration{"": 0, "36h": 36 * time.Hour, "30d": 30 * 24 * time.Hour, "1.5d": 36 * time.Hour} {
		if d, err := ParseSince(s); err != nil || d != want {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
}
