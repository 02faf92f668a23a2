package watch

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Tier is the watched directory as a restore tier (checkpoint.Tier, #38):
// a checkpoint the trainer wrote, still in DIR under the name its commit
// recorded, is this machine's copy of it. Restore verifies every file
// against the manifest's size and digest as it copies it, and fetches what differs, or is
// gone, from the store; the trainer's directory itself is only read.
func (w *Watcher) Tier() checkpoint.Tier { return dirTier{w} }

type dirTier struct{ w *Watcher }

func (dirTier) Name() string { return checkpoint.FromLocal }

var _ checkpoint.CopyRefuser = dirTier{}

// RefuseCopy does nothing: each file in DIR is its own source (the
// trainer may have rewritten one), so a copy that fails its digest costs
// that file's download and the other files are still read from DIR; and
// DIR is the trainer's, only read (Restore moves a checkpoint that
// differs aside, never deletes it).
func (dirTier) RefuseCopy(*checkpoint.Manifest, checkpoint.File, error) {}

func (t dirTier) Open(ctx context.Context, m *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	o, err := originOf(m)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fs.ErrNotExist, err)
	}
	rel := path.Join(o.Name, f.Path)
	if o.Kind == kindFile {
		rel = o.Name
	}
	fh, err := checkpoint.OpenRegular(t.w.root, rel, f.Size)
	if err != nil {
		return nil, err
	}
	// A file of another user than the trainer's (a hard link it planted
	// to one only the agent may read) is never read, even to compare.
	if err := t.owned(fh); err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	return fh, nil
}

func (t dirTier) owned(fh *os.File) error {
	if !t.w.owner.on {
		return nil
	}
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != t.w.owner.uid || st.Nlink > 1) {
		return fmt.Errorf("owned by uid %d with %d links, not the trainer's (uid %d) alone: %w", st.Uid, st.Nlink, t.w.owner.uid, checkpoint.ErrNotOwned)
	}
	return nil
}
