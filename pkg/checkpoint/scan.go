package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// ErrRefused reports a checkpoint directory that holds something the agent
// will not upload: a symlink, a device, a socket, or a path outside it.
var ErrRefused = errors.New("refused")

// localFile is one regular file found in a checkpoint directory.
type localFile struct {
	rel  string // "/"-separated, relative to the directory
	size int64
}

// scan lists the regular files under dir. Anything that is not a regular
// file or a directory (symlinks included, wherever they point) refuses the
// whole checkpoint: committing part of what the trainer meant to save would
// be worse than committing nothing.
func scan(dir string) ([]localFile, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("checkpoint directory %s: not a directory (%s): %w", dir, fi.Mode().Type(), ErrRefused)
	}
	var files []localFile
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t.IsRegular():
		default:
			return fmt.Errorf("%s: %s is not a regular file: %w", rel, t, ErrRefused)
		}
		if err := SafeRel(rel); err != nil {
			return fmt.Errorf("%s: %w", rel, ErrRefused)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, localFile{rel: rel, size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("scan %s: no files", dir)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	return files, nil
}
