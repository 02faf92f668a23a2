package watch

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"syscall"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// The owner rule. The agent reads the trainer's checkpoints with its own
// rights (root, as a sidecar often runs): a trainer of another user that
// hard-links a file only the agent may read (fs.protected_hardlinks=0)
// into a checkpoint would get it back through the store and a restore.
// So when the trainer is another user than the agent, every file of a
// checkpoint must be owned by the trainer's uid: Config.UID
// (--watch-uid), else DIR's owner (the user who made DIR, or the volume's
// owner). A hard link keeps its inode's owner, so a link to a file of
// another user is refused; a file of the trainer's own it could read
// anyway. Unlike protocol mode there is no one-link rule: the agent's own
// staging adds a link to every file, and a link count adds nothing the
// owner does not already say about a file the trainer can read. A trainer
// of the agent's own user crosses no boundary and is not checked.

// ownerRule is the uid every file of a checkpoint must have (on), or none.
type ownerRule struct {
	on  bool
	uid int
}

// ownerOf resolves the owner rule for DIR (root, as opened): cfg.UID, else
// DIR's owner; none when that is the agent's own user.
func ownerOf(cfg Config, root *os.Root, log *zap.Logger) (ownerRule, error) {
	fi, err := root.Stat(".")
	if err != nil {
		return ownerRule{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ownerRule{}, nil // no uids here
	}
	uid := int(st.Uid)
	if cfg.UID != nil {
		uid = *cfg.UID
	}
	if uid != os.Geteuid() {
		return ownerRule{on: true, uid: uid}, nil
	}
	if cfg.UID == nil && fi.Mode().Perm()&0o022 != 0 {
		log.Warn("the watched directory is the agent's own and other users may write to it: their checkpoints are uploaded with the agent's rights, unchecked; give --watch-uid the trainer's uid",
			zap.String("dir", cfg.Dir), zap.Int("owner", uid), zap.String("mode", fi.Mode().Perm().String()))
	}
	return ownerRule{}, nil
}

// check refuses the first file of fp (the checkpoint name) that is not
// owned by the rule's uid.
func (o ownerRule) check(fp fingerprint, name string) error {
	if !o.on {
		return nil
	}
	for _, e := range fp {
		if !e.dir && e.uid >= 0 && e.uid != o.uid {
			return fmt.Errorf("%s is owned by uid %d, not by the trainer (uid %d; --watch-uid): %w", path.Join(name, e.rel), e.uid, o.uid, checkpoint.ErrNotOwned)
		}
	}
	return nil
}

// uidOf is fi's owner (-1: unknown).
func uidOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// chownTree gives the restored tree rel below dir to the rule's uid, so
// that the trainer owns what it resumes from (it may delete or rotate it)
// and the owner rule does not refuse it. Symlinks are never followed
// (there are none in a verified restore).
func (o ownerRule) chownTree(dir *os.Root, rel string) error {
	if !o.on {
		return nil
	}
	if err := dir.Lchown(rel, o.uid, -1); err != nil {
		return err
	}
	fi, err := dir.Lstat(rel)
	if err != nil || !fi.IsDir() {
		return err
	}
	ents, err := readDir(dir, rel)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := o.chownTree(dir, path.Join(rel, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
