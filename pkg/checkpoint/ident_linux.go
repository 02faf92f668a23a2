package checkpoint

import (
	"os"
	"syscall"
	"time"
)

// fileIdent is what must stay the same for an uploaded file to still be
// the file on disk: which file (device, inode), and its size, mtime and
// ctime. ctime cannot be set by a process: any write or rename moves it.
type fileIdent struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

func identOf(fi os.FileInfo) fileIdent {
	id := fileIdent{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
		id.ctime = st.Ctim.Nano()
	}
	return id
}

func (id fileIdent) noCtime() fileIdent { id.ctime = 0; return id }

// ChangeTime is when fi's file last changed: the later of its mtime and
// ctime (a chmod or link moves only ctime, which identOf compares too).
func ChangeTime(fi os.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if c := time.Unix(st.Ctim.Unix()); c.After(t) {
			t = c
		}
	}
	return t
}
