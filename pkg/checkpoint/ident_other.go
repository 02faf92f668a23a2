//go:build !linux

package checkpoint

import (
	"os"
	"time"
)

// fileIdent is what must stay the same for an uploaded file to still be
// the file on disk. Outside Linux: size and mtime (os.SameFile is checked
// when the file is opened).
type fileIdent struct {
	size  int64
	mtime int64
}

func identOf(fi os.FileInfo) fileIdent {
	return fileIdent{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

func (id fileIdent) noCtime() fileIdent { return id }

// ChangeTime is when fi's file last changed (its mtime: identOf's only time).
func ChangeTime(fi os.FileInfo) time.Time { return fi.ModTime() }
