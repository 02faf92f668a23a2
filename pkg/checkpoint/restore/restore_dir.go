package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// ErrDestNotEmpty means Dir's directory holds files and replacing
// them was not asked for.
var ErrDestNotEmpty = errors.New("not empty")

// Dir restores like Restore, but puts the checkpoint's files
// directly in dir (spotagent restore --dest) and reports dir as Result.Dir.
// dir must be missing or empty unless replace is set. The checkpoint is
// downloaded and verified in a temporary directory beside dir, then renamed
// into place: dir is never left half-written. With replace, dir's old
// contents are swapped out in the same step and deleted.
//
// When dir is a mount point (nothing can be renamed onto it) the checkpoint
// is staged in a hidden directory inside it and moved up entry by entry;
// replace is refused there.
func Dir(ctx context.Context, st cloud.Store, dir string, replace bool, opts Options) (*Result, error) {
	dir = filepath.Clean(dir)
	fi, err := os.Lstat(dir)
	exists := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case !fi.IsDir():
		return nil, fmt.Errorf("%s: not a directory", dir)
	}
	empty := true
	if exists {
		if empty, err = isEmptyDir(dir); err != nil {
			return nil, err
		}
		if !empty && !replace {
			return nil, fmt.Errorf("%s: %w", dir, ErrDestNotEmpty)
		}
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	mount := false
	if exists {
		pfi, err := os.Stat(parent)
		if err != nil {
			return nil, err
		}
		mount = !sameDevice(fi, pfi)
	}
	if mount && !empty {
		return nil, fmt.Errorf("%s: a mount point: its contents cannot be replaced in one step: empty it first", dir)
	}
	stageIn, prefix := parent, "."+filepath.Base(dir)+".restore-"
	if mount {
		stageIn, prefix = dir, ".spotagent-restore-"
	}
	stage, err := os.MkdirTemp(stageIn, prefix)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	r, err := Checkpoint(ctx, st, stage, opts)
	if err != nil {
		return nil, err
	}
	if mount {
		err = moveEntries(r.Dir, dir)
	} else {
		err = swapIn(r.Dir, dir, exists, empty, fi, stage)
	}
	if err != nil {
		return nil, fmt.Errorf("restore into %s: %w", dir, err)
	}
	r.Dir = dir
	return r, nil
}

// swapIn renames the directory src to dst. A missing or empty dst is
// replaced in one rename; a full one is first renamed into trash (deleted
// by the caller) and put back if the second rename fails.
func swapIn(src, dst string, exists, empty bool, old fs.FileInfo, trash string) error {
	if exists {
		if err := os.Chmod(src, old.Mode().Perm()); err != nil {
			return err
		}
	}
	if !exists || empty {
		return renameOntoEmpty(src, dst)
	}
	prev := filepath.Join(trash, "previous")
	if err := os.Rename(dst, prev); err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		if e := os.Rename(prev, dst); e != nil {
			return fmt.Errorf("%w (and putting the old contents back: %v; they are in %s)", err, e, prev)
		}
		return err
	}
	return nil
}

// moveEntries renames every entry of src into dst (the same file system).
func moveEntries(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}
