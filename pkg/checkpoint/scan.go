package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"unicode/utf8"
)

// ErrRefused reports a checkpoint directory that holds something the agent
// will not upload: a symlink, a device, a socket, or a path outside it.
var ErrRefused = errors.New("refused")

// LocalFile is one regular file found in a checkpoint directory.
type LocalFile struct {
	Rel  string // "/"-separated, relative to the directory
	Size int64
}

// Scan lists the regular files under root. Anything that is not a regular
// file or a directory (symlinks included, wherever they point) refuses the
// whole checkpoint: committing part of what the trainer meant to save would
// be worse than committing nothing. So does a name that is not UTF-8: the
// manifest is JSON, which would turn it into another name that no object
// has. Directories are opened with O_NONBLOCK|O_DIRECTORY, so a FIFO
// swapped in for one fails at once instead of blocking.
func Scan(root *os.Root) ([]LocalFile, error) {
	var files []LocalFile
	if err := scanDir(root, ".", &files); err != nil {
		return nil, fmt.Errorf("scan %s: %w", root.Name(), err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("scan %s: no files", root.Name())
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Rel < files[j].Rel })
	return files, nil
}

func scanDir(root *os.Root, dir string, files *[]LocalFile) error {
	d, err := root.OpenFile(dir, os.O_RDONLY|ONonblock|oDirectory, 0)
	if err != nil {
		return err
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		rel := path.Join(dir, e.Name())
		if !utf8.ValidString(e.Name()) {
			return fmt.Errorf("%q: file name is not valid UTF-8: %w", rel, ErrRefused)
		}
		if err := SafeRel(rel); err != nil {
			return fmt.Errorf("%q: %w", rel, ErrRefused)
		}
		switch t := e.Type(); {
		case t.IsDir():
			if err := scanDir(root, rel, files); err != nil {
				return err
			}
			continue
		case t.IsRegular():
		default:
			return fmt.Errorf("%s: %s is not a regular file: %w", rel, t, ErrRefused)
		}
		info, err := root.Lstat(rel) // not e.Info(): that goes by path
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() { // replaced since the listing
			return fmt.Errorf("%s: %s is not a regular file: %w", rel, info.Mode().Type(), ErrRefused)
		}
		*files = append(*files, LocalFile{Rel: rel, Size: info.Size()})
	}
	return nil
}

// OpenLocalDir opens dir, which must be a directory and not a symlink, and
// makes sure what it opened is what it checked: for a commit, a check of a
// local copy, or watch mode's handle on DIR.
func OpenLocalDir(dir string) (*os.Root, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("checkpoint directory %s: not a directory (%s): %w", dir, fi.Mode().Type(), ErrRefused)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	if got, err := r.Stat("."); err != nil || !os.SameFile(fi, got) {
		r.Close()
		return nil, fmt.Errorf("checkpoint directory %s changed while it was opened: %w", dir, ErrRefused)
	}
	return r, nil
}
