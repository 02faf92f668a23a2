package checkpoint

import (
	"context"
	"io"
	"os"
	"path"
)

// A Tier is a copy of committed checkpoints nearer than the store: this
// machine's disk (pkg/checkpoint/localtier), a peer's (docs/distributed.md).
// Restore chooses the checkpoint by the store's rules first and only then
// asks the tiers, nearest first, for each of its files; what a tier gives
// is verified against the manifest's size and digest (BLAKE3: a CRC32C is
// forged with four bytes) before any of it is used, and a file no tier
// holds, or whose copy fails, comes from the next tier, finally the store.
// A file whose entry records no digest (a manifest from before digests)
// comes from the store only. A tier can therefore make a restore faster,
// never older or different.
type Tier interface {
	// Name names the tier in logs, the journal and the metrics.
	Name() string
	// Open returns the tier's copy of file f of checkpoint m, or an error
	// wrapping fs.ErrNotExist when it holds none. The caller closes it.
	Open(ctx context.Context, m *Manifest, f File) (io.ReadCloser, error)
}

// A Refusable is a copy a Tier's Open returned that can be told its bytes
// failed verification: the tier then asks that copy's source (a peer) no
// more for the rest of the restore.
type Refusable interface {
	Refuse(err error)
}

// A CopyRefuser is a Tier whose every copy is its own source (the local
// tier: a file on this disk): told that its copy of f failed verification,
// it drops that copy, and is still asked for the other files. A tier whose
// copies are neither Refusable nor its own sources this way is not asked
// again by that restore.
type CopyRefuser interface {
	RefuseCopy(m *Manifest, f File, err error)
}

// Where restored bytes came from (restore.Result.From), besides a tier's name.
const (
	FromStore = "store"
	// FromLocal is this machine: the local tier, or a verified copy
	// already in the restore directory.
	FromLocal = "local"
	// FromPeer is another node of the job (pkg/checkpoint/peertier).
	FromPeer = "peer"
)

// OpenRegular opens the regular file rel below root for reading, of size
// size, refusing a symlink anywhere in rel, a FIFO, a device or another
// size, without ever blocking in open(2): how a tier opens its copies.
func OpenRegular(root *os.Root, rel string, size int64) (*os.File, error) {
	dir, base := path.Split(rel)
	if dir == "" {
		return OpenScanned(root, base, size)
	}
	sub, err := OpenDir(root, dir)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return OpenScanned(sub, base, size)
}
