package render

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

func TestRanges(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{{nil, ""}, {[]int{4}, "4"}, {[]int{0, 1, 2, 3, 6, 8, 9}, "0-3,6,8-9"}, {[]int{1, 3, 5}, "1,3,5"}} {
		if got := Ranges(c.in); got != c.want {
			t.Errorf("Ranges(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	if Plural(1, "session") != "1 session" || Plural(0, "session") != "0 sessions" || Plural(3, "part") != "3 parts" {
		t.Error("Plural")
	}
	if OrDash("") != "-" || OrDash("x") != "x" || Upper("aws-1a") != "AWS-1A" {
		t.Error("OrDash or Upper")
	}
	if age(-time.Second) != "0s" || age(1500*time.Millisecond) != "2s" || age(90*time.Minute+20*time.Second) != "1h30m0s" {
		t.Errorf("age: %q %q %q", age(-time.Second), age(1500*time.Millisecond), age(90*time.Minute+20*time.Second))
	}
}

// TestCheckpoints: the latest checkpoint is marked, a job checkpoint's
// parts listed with their ranks, a broken manifest and an incomplete job
// checkpoint said as such.
func TestCheckpoints(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	entries := []checkpoint.Entry{
		{Key: "m/7", Manifest: &checkpoint.Manifest{ID: "c7", Step: 7, Reason: "periodic", Created: created,
			Files: []checkpoint.File{{Path: "a", Size: 2048}}}},
		{Key: "m/9", Manifest: &checkpoint.Manifest{ID: "c9", Step: 9, Reason: "notice", Created: created,
			Parts: []checkpoint.PartInfo{{Node: "node-0", Ranks: []int{0, 1, 2, 3}, Files: 4, Bytes: 1 << 20}}}},
		{Key: "m/bad", Err: errors.New("checksum mismatch")},
	}
	var b bytes.Buffer
	Checkpoints(&b, entries, []checkpoint.Incomplete{{Step: 11, ID: "c11", Missing: []int{2, 3}}}, checkpoint.Latest{Manifest: "m/9"})
	out := b.String()
	for _, want := range []string{"c9 (latest)", "part node-0", "ranks 0-3", "broken: checksum mismatch", "incomplete: no manifest, ranks 2-3 missing"} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "c7 (latest)") {
		t.Errorf("c7 marked latest:\n%s", out)
	}
}
