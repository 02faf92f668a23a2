package checkpoint

import "os"

// FileIdent is a file's identity as the committer checks it (identOf):
// device and inode, size, mtime and, on Linux, ctime. Exported for watch
// mode, which fingerprints the trainer's own checkpoints with it.
type FileIdent struct{ id fileIdent }

// IdentOf is fi's identity (fi from Lstat or Stat, not from a directory
// listing: that has no inode).
func IdentOf(fi os.FileInfo) FileIdent { return FileIdent{identOf(fi)} }

// SameData reports whether a and b are equal but for ctime: the same
// file, size and mtime. A hard link to the file moves its ctime, so a
// watched checkpoint staged by linking is compared with SameData before
// and after.
func (a FileIdent) SameData(b FileIdent) bool { return a.id.noCtime() == b.id.noCtime() }
