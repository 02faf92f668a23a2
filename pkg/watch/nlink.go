package watch

import (
	"io/fs"
	"syscall"
)

// nlinkOf is fi's number of hard links (0: unknown).
func nlinkOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}
