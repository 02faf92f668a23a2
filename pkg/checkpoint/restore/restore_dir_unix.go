//go:build unix

package restore

import (
	"io/fs"
	"os"
	"syscall"
)

// sameDevice reports whether a and b are on the same file system (a
// directory on another one than its parent is a mount point).
func sameDevice(a, b fs.FileInfo) bool {
	x, ok1 := a.Sys().(*syscall.Stat_t)
	y, ok2 := b.Sys().(*syscall.Stat_t)
	return !ok1 || !ok2 || x.Dev == y.Dev
}

// renameOntoEmpty renames the directory src to dst, which may be an empty
// directory: rename(2) replaces it in one step (os.Rename refuses to).
func renameOntoEmpty(src, dst string) error {
	if err := syscall.Rename(src, dst); err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	return nil
}
