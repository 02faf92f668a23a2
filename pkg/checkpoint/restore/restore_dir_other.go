//go:build !unix

package restore

import (
	"errors"
	"io/fs"
	"os"
)

// sameDevice: no portable device number here; assume one file system.
func sameDevice(a, b fs.FileInfo) bool { return true }

// renameOntoEmpty renames the directory src to dst, which may be an empty
// directory (removed first: not atomic here).
func renameOntoEmpty(src, dst string) error {
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Rename(src, dst)
}
