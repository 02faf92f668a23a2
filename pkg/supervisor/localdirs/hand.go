package localdirs

// What the agent hands to a trainer of another uid than its own when it
// runs as root (node or sidecar mode with --allow-uid): a request's
// directory (HandTo), the way to it through the agent's directories
// (LetThrough), a restored checkpoint to read (HandRestore).

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// A restored checkpoint handed to a trainer of another uid than a root
// agent's (node or sidecar mode with --allow-uid; HandRestore) is:
//
//	restore/                  root's, 0711 (search only: nothing listed)
//	restore/<name>/           the trainer uid's, 0500: only it (and root) enters
//	restore/<name>/<subdir>/  root's, 0555
//	restore/<name>/<file>     root's, 0444: read, never written nor chmodded
//	restore/<name>.manifest.json  the trainer uid's, 0400
//
// The files are the restore's own copies (restore writes each one, from
// the local tier or the store; nothing is linked to the local tier's
// copies), and they stay root's: the trainer reads them through the one
// directory it owns, and can change no byte of them. It can add or
// rename entries in that directory (it owns it): the agent never reads a
// handed directory again (FetchRestore deletes it rather than reuse it).
const (
	handedDirMode  = 0o500
	handedSubMode  = 0o555
	handedFileMode = 0o444
	handedManMode  = 0o400
)

// HandRestore lets uid, and no one else but root, read the restored
// checkpoint dir and its manifest copy manifest (both as FetchRestore
// returned them, directly in the restore area; manifest may be ""), and
// lets it through the agent's directories above (LetThrough). Everything
// is opened through the area's handle refusing symlinks and changed
// through the opened handles. Handing again to the same uid does nothing;
// a directory already handed to another uid is refused (its trainer may
// have changed what is in it).
func (d *Dirs) HandRestore(dir, manifest string, uid int) error {
	if uid < 0 || uid == os.Geteuid() {
		return nil
	}
	name, err := d.inRestoreArea(dir)
	if err != nil {
		return err
	}
	rest, err := checkpoint.OpenDir(d.Area, RestoreSub)
	if err != nil {
		return fmt.Errorf("restore area: %w", err)
	}
	defer rest.Close()
	if err := handTree(rest, name, uid); err != nil {
		return fmt.Errorf("restored checkpoint %s: %w", dir, err)
	}
	if manifest != "" {
		mname, err := d.inRestoreArea(manifest)
		if err != nil {
			return err
		}
		if err := handManifest(rest, mname, uid); err != nil {
			return fmt.Errorf("manifest copy %s: %w", manifest, err)
		}
	}
	for _, r := range []*os.Root{rest, d.Area, d.Root} {
		if err := LetThrough(r); err != nil {
			return err
		}
	}
	return nil
}

// inRestoreArea returns the name of p, which must be an entry directly in
// the restore area.
func (d *Dirs) inRestoreArea(p string) (string, error) {
	name := filepath.Base(p)
	if filepath.Clean(p) != filepath.Join(d.RestoreDir(), name) || name == "." || name == ".." {
		return "", fmt.Errorf("%s is not in the restore area %s: %w", p, d.RestoreDir(), checkpoint.ErrRefused)
	}
	return name, nil
}

// handManifest gives the manifest copy name below rest to uid, 0400.
func handManifest(rest *os.Root, name string, uid int) error {
	f, err := rest.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // not written (logged by FetchRestore): nothing to hand
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), checkpoint.ErrRefused)
	}
	if err := owned(fi, uid); err != nil {
		return err
	}
	if err := f.Chmod(handedManMode); err != nil {
		return err
	}
	return f.Chown(uid, -1)
}

// owned refuses fi when another uid than the agent's euid or uid owns it.
func owned(fi fs.FileInfo, uid int) error {
	if o := ownerUID(fi); o != os.Geteuid() && o != uid {
		return fmt.Errorf("already handed to uid %d, not to uid %d: %w", o, uid, checkpoint.ErrRefused)
	}
	return nil
}

// handTree makes the tree name below rest root's and read-only (0555
// directories, 0444 files), then its top directory uid's, 0500, last:
// until then it is root's and 0700, so nobody else can change it while it
// is walked. Only directories and regular files are accepted (a restore
// makes nothing else). Already uid's: nothing to do.
func handTree(rest *os.Root, name string, uid int) error {
	top, err := checkpoint.OpenDir(rest, name)
	if err != nil {
		return err
	}
	defer top.Close()
	tf, err := top.Open(".")
	if err != nil {
		return err
	}
	defer tf.Close()
	fi, err := tf.Stat()
	if err != nil {
		return err
	}
	if err := owned(fi, uid); err != nil {
		return err
	}
	if ownerUID(fi) == uid {
		return nil
	}
	if err := readOnlyBelow(top, "."); err != nil {
		return err
	}
	if err := tf.Chmod(handedDirMode); err != nil {
		return err
	}
	return tf.Chown(uid, -1)
}

// readOnlyBelow makes every entry of the directory rel below top (its
// subdirectories recursively) read-only for everyone, through handles
// opened without following a symlink.
func readOnlyBelow(top *os.Root, rel string) error {
	d, err := top.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(rel, n)
		f, err := top.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err) // a symlink: ELOOP
		}
		fi, err := f.Stat()
		switch {
		case err != nil:
		case fi.IsDir():
			err = f.Chmod(handedSubMode)
		case fi.Mode().IsRegular():
			err = f.Chmod(handedFileMode)
		default:
			err = fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), checkpoint.ErrRefused)
		}
		f.Close()
		if err == nil && fi.IsDir() {
			err = readOnlyBelow(top, p)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// dropHanded deletes the entries of the restore area rest that the agent
// no longer owns (handed to a trainer's uid by an earlier start): their
// trainer may have changed them, so they are never reused.
func dropHanded(rest *os.Root) {
	euid := os.Geteuid()
	for _, n := range readNames(rest) {
		if fi, err := rest.Lstat(n); err == nil && ownerUID(fi) != euid {
			rest.RemoveAll(n)
		}
	}
}

// LetThrough adds the search bit (x) for group and others to the
// directory r is open on, when the agent's euid owns it: a trainer of
// another uid can then reach a directory below it by name (HandTo), but
// neither list nor write this one. Through the handle: never a symlink.
func LetThrough(r *os.Root) error {
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	perm := fi.Mode().Perm()
	if ownerUID(fi) != os.Geteuid() || perm&0o011 == 0o011 {
		return nil
	}
	if err := f.Chmod(perm | 0o011); err != nil {
		return fmt.Errorf("chmod %o: %w", perm|0o011, err)
	}
	return nil
}

// HandTo gives the directory name below r, which the agent just made
// (0700), to uid: the trainer of that uid writes its checkpoint there and
// nobody else can (the agent, root, still reads it to upload). Opened
// through r refusing a symlink, and changed through that handle.
func HandTo(r *os.Root, name string, uid int) error {
	d, err := checkpoint.OpenDir(r, name)
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := d.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(uid, -1); err != nil {
		return fmt.Errorf("chown %d: %w", uid, err)
	}
	return f.Chmod(0o700)
}
