// Package hostcopies prepares a node's directory for a pod's copies on a
// Kubernetes hostPath (docs/kubernetes.md, "Copies that outlive the
// pods"): <root>/<namespace>/<run>/node-<rank>, made and handed to the
// trainer's uid before the sidecar starts, and other runs' copies that
// nothing touched for the retention removed. It is what the chart's
// `copies` init container runs (`spotagent prepare-copies`, as root).
//
// Every path is reached through an os.Root opened on the hostPath, so no
// symbolic link, and no rename racing the walk, can lead a step outside
// it; inside it, the rules are the shell script's that came before:
//   - a symbolic link at <namespace>, <run> or node-<rank> is refused
//     before anything is made (MkdirAll would follow it);
//   - the root, <namespace> and <run> must be directories that the owner (root)
//     alone may write: only then is node-<rank> still what was checked
//     when it is handed over (nobody else can rename it);
//   - node-<rank> is handed over with Lchown (never follows a link) and
//     made 0700;
//   - a stale run is removed with Root.RemoveAll, which removes a link
//     found inside, never what it points to, and cannot be steered out of
//     the root by a trainer renaming its directories meanwhile.
package hostcopies

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options name the pod's directory and the rules around it.
type Options struct {
	Namespace string // the pod's namespace
	Run       string // the run (JobSet, TrainJob or the chart's runId)
	Node      int    // the node's rank: node-<Node>
	UID, GID  int    // the trainer's: node-<Node> is handed to them
	// Owner is who alone may write <namespace> and <run> (0, root, in
	// the container; a test that is not root passes its own uid).
	Owner int
	// Retain: other runs with nothing newer are removed (0: none is).
	Retain time.Duration
	Now    time.Time // the zero time: time.Now()
}

// Result is what Prepare did.
type Result struct {
	Dir     string   // <namespace>/<run>/node-<rank>, relative to the root
	Removed []string // stale runs removed, relative to the root
	// Unremoved: stale runs that could not be removed (an immutable
	// file, a mount under it); the pod's directory is ready all the same.
	Unremoved error
}

// ErrRefused is a path the rules refuse: nothing was handed over.
var ErrRefused = errors.New("refused")

// Prepare makes and hands over opts' directory under root, then removes
// stale runs. A refusal (ErrRefused) changes nothing; a stale run that
// cannot be removed is reported in Result.Unremoved, not as an error: one
// undeletable directory on a node must not fail every pod placed there.
func Prepare(root *os.Root, opts Options) (Result, error) {
	for _, n := range []struct{ what, v string }{{"namespace", opts.Namespace}, {"run", opts.Run}} {
		if err := checkName(n.v); err != nil {
			return Result{}, fmt.Errorf("%s %q: %w", n.what, n.v, err)
		}
	}
	if opts.Node < 0 {
		return Result{}, fmt.Errorf("node rank %d: want 0 or more", opts.Node)
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	top := path.Join(opts.Namespace, opts.Run)
	dir := path.Join(top, "node-"+strconv.Itoa(opts.Node))
	for _, p := range []string{opts.Namespace, top, dir} {
		fi, err := root.Lstat(p)
		if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return Result{}, fmt.Errorf("%s is a symbolic link: %w", p, ErrRefused)
		}
	}
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return Result{}, fmt.Errorf("make %s: %w", dir, err)
	}
	for _, p := range []string{".", opts.Namespace, top} {
		if err := ownerOnly(root, p, opts.Owner); err != nil {
			return Result{}, err
		}
	}
	fi, err := root.Lstat(dir)
	if err != nil {
		return Result{}, err
	}
	if !fi.IsDir() {
		return Result{}, fmt.Errorf("%s is not a directory: %w", dir, ErrRefused)
	}
	if err := root.Lchown(dir, opts.UID, opts.GID); err != nil {
		return Result{}, fmt.Errorf("hand %s to %d:%d: %w", dir, opts.UID, opts.GID, err)
	}
	if err := root.Chmod(dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("chmod %s: %w", dir, err)
	}
	if err := root.Chtimes(top, opts.Now, opts.Now); err != nil {
		return Result{}, fmt.Errorf("touch %s: %w", top, err)
	}
	res := Result{Dir: dir}
	if opts.Retain <= 0 {
		return res, nil
	}
	res.Removed, res.Unremoved = removeStale(root, top, opts.Now.Add(-opts.Retain))
	return res, nil
}

// checkName: one path element a Kubernetes name can be.
func checkName(v string) error {
	switch {
	case v == "":
		return errors.New("empty")
	case v == "." || v == ".." || strings.ContainsAny(v, "/\x00"):
		return errors.New("not a single path element")
	}
	return nil
}

// ownerOnly refuses p unless it is a directory owned by owner that
// neither its group nor others may write.
func ownerOnly(root *os.Root, p string, owner int) error {
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != owner || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is not a directory that uid %d alone may write: %w", p, owner, ErrRefused)
	}
	return nil
}

// removeStale removes every <namespace>/<run> (and an earlier layout's
// <run>/node-<rank>) but keep whose newest entry is older than cutoff.
func removeStale(root *os.Root, keep string, cutoff time.Time) ([]string, error) {
	tops, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ns := range tops {
		if !ns.IsDir() {
			continue
		}
		runs, err := fs.ReadDir(root.FS(), ns.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range runs {
			d := path.Join(ns.Name(), r.Name())
			if !r.IsDir() || d == keep || newer(root, d, cutoff) {
				continue
			}
			if err := root.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
				continue
			}
			removed = append(removed, d)
		}
	}
	return removed, errors.Join(errs...)
}

// newer reports whether d or anything under it (links not followed) was
// modified after cutoff; what cannot be read counts as newer (kept).
func newer(root *os.Root, d string, cutoff time.Time) bool {
	found := false
	err := fs.WalkDir(root.FS(), d, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if fi.ModTime().After(cutoff) {
			found = true
			return fs.SkipAll
		}
		return nil
	})
	return found || err != nil
}
