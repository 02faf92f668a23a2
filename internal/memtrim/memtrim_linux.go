package memtrim

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Release unmaps the executable's read-only file mappings (code and
// read-only data) from the process's page tables. Safe at any time and
// from any goroutine: pages are faulted back in as they are used.
func Release() (Released, error) {
	var exe syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &exe); err != nil {
		return Released{}, fmt.Errorf("memtrim: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return Released{}, fmt.Errorf("memtrim: %w", err)
	}
	defer f.Close()
	type span struct{ lo, hi uintptr }
	var spans []span
	var rel Released
	own := false // the mapping being read is one to release
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fs := strings.Fields(line)
		if len(fs) >= 5 && strings.Contains(fs[0], "-") && len(fs[1]) == 4 {
			// "lo-hi perms offset dev inode [path]": a mapping's header.
			own = false
			lo, hi, _ := strings.Cut(fs[0], "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			ino, err3 := strconv.ParseUint(fs[4], 10, 64)
			maj, min, ok := parseDev(fs[3])
			if err1 != nil || err2 != nil || err3 != nil || !ok {
				continue
			}
			// Read-only (never written, so the file's bytes), of this
			// executable: the same device and inode as /proc/self/exe.
			if fs[1][0] == 'r' && fs[1][1] == '-' && ino == exe.Ino && mkdev(maj, min) == uint64(exe.Dev) {
				own = true
				spans = append(spans, span{uintptr(a), uintptr(b)})
				rel.Mapped += int64(b - a)
			}
			continue
		}
		if own && len(fs) >= 2 && fs[0] == "Rss:" {
			if kb, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
				rel.Resident += kb << 10
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Released{}, fmt.Errorf("memtrim: %w", err)
	}
	for _, s := range spans {
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, s.lo, s.hi-s.lo, syscall.MADV_DONTNEED); e != 0 {
			return rel, fmt.Errorf("memtrim: madvise: %w", e)
		}
	}
	return rel, nil
}

// parseDev parses the "maj:min" (hex) device field of /proc/PID/maps.
func parseDev(s string) (maj, min uint64, ok bool) {
	a, b, found := strings.Cut(s, ":")
	if !found {
		return 0, 0, false
	}
	maj, err1 := strconv.ParseUint(a, 16, 32)
	min, err2 := strconv.ParseUint(b, 16, 32)
	return maj, min, err1 == nil && err2 == nil
}

// mkdev is the kernel's encoding of a device number in st_dev (glibc's
// gnu_dev_makedev).
func mkdev(maj, min uint64) uint64 {
	return (maj&0xfff)<<8 | (maj&^0xfff)<<32 | min&0xff | (min&^0xff)<<12
}
