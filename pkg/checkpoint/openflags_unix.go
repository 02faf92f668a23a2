//go:build unix

package checkpoint

import "syscall"

// Open flags for files a trainer can replace: never block in open(2) (a
// FIFO would), open a directory only if it is one, and never follow a
// symlink at the final name when creating.
const (
	ONonblock  = syscall.O_NONBLOCK
	oDirectory = syscall.O_DIRECTORY
	ONoFollow  = syscall.O_NOFOLLOW
)
