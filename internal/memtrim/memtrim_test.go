package memtrim

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// rssFile is this process's RssFile in bytes (/proc/self/status).
func rssFile(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestRelease: the test binary's code and read-only data are released
// (RssFile falls by most of what was resident) and the process goes on
// running the released code: this test's own code and the runtime's fault
// back in.
func TestRelease(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Release is a no-op outside Linux")
	}
	before := rssFile(t)
	rel, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if rel.Mapped <= 0 || rel.Resident <= 0 || rel.Resident > rel.Mapped {
		t.Fatalf("released %+v: want a mapped size and a resident part of it", rel)
	}
	if drop := before - after; drop < rel.Resident/4 {
		t.Fatalf("RssFile %d → %d bytes: dropped %d, want at least a quarter of the %d resident (what runs faults back in, 64 KiB at a time)", before, after, drop, rel.Resident)
	}
	// Still runs: a goroutine, a map, formatting, the GC.
	done := make(chan string)
	go func() { done <- strconv.Itoa(len(map[int]int{1: 1})) + strings.Repeat("x", 3) }()
	if got := <-done; got != "1xxx" {
		t.Fatalf("after release: %q", got)
	}
	runtime.GC()
	if _, err := Release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
}
