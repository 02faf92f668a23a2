// Package pathtrust finds who, besides root and the agent, can change
// where a path leads. A user who owns a directory on the way, or can
// write one that lacks the sticky bit, can rename what lies below it away
// and put a directory of theirs in its place: the next open of the path
// (a trainer's, told the path) lands in theirs. A sticky directory (like
// /tmp) lets each user rename only their own entries, so it is safe when
// the entries on the way are trusted users'.
//
// One walk serves every such check: the checkpoint directory's
// ancestors (pkg/supervisor/internal/localdirs), the watched directory's
// (pkg/watch), the private socket directory's (pkg/protocol) and a
// file:// store's (pkg/cloud/file).
package pathtrust

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Unsafe is a directory on the way to a path that an untrusted user can
// change, or a symlink on the way that one owns.
type Unsafe struct {
	Path     string      // the directory or the symlink
	Owner    int         // its owner's uid (-1: unknown, trusted by nobody)
	Mode     fs.FileMode // its mode
	Writable bool        // trusted owner, but writable by group or others without the sticky bit
}

// Error says what is wrong with it: "/tmp/x is owned by uid 65534
// (nobody), mode drwxr-xr-x".
func (u Unsafe) Error() string {
	switch {
	case u.Writable:
		return fmt.Sprintf("%s is writable by group or others without the sticky bit (owner %s, mode %s)", u.Path, UIDName(u.Owner), u.Mode)
	case u.Mode&fs.ModeSymlink != 0:
		return fmt.Sprintf("%s is a symlink owned by %s", u.Path, UIDName(u.Owner))
	}
	return fmt.Sprintf("%s is owned by %s, mode %s", u.Path, UIDName(u.Owner), u.Mode)
}

// Fix is what an operator can do about it.
func (u Unsafe) Fix() string {
	if u.Writable {
		return "chmod +t " + u.Path + " (sticky, like /tmp) or chmod go-w it, or pick a directory elsewhere"
	}
	return "pick a directory elsewhere, or chown " + u.Path + " to root or to the agent's user"
}

// Trusted is root, the agent's euid, and an owner outside the agent's user
// namespace (Outside).
func Trusted(uid int) bool { return uid == 0 || uid == os.Geteuid() || Outside(uid) }

// Outside reports whether uid is how the kernel shows an owner outside
// this process's user namespace: the overflow uid (65534), when the
// namespace maps no uid to it. In a rootless container, `unshare -r` or
// Apptainer without setuid, the host's root and every host user the
// namespace does not map show as that uid: /, /tmp and $HOME's parents
// would all be refused. Nobody inside the namespace can own such a file
// or create one (their files get their mapped uids), so none of the
// agent's neighbours in it can rename those directories, unless their
// mode lets them (judged as ever). In the first namespace every uid is
// mapped and 65534 is nobody, an ordinary user: Outside is false.
func Outside(uid int) bool {
	o := outside()
	return o.unmapped && uid == o.overflow
}

// outside reads this process's overflow uid and whether its user
// namespace maps it, once.
var outside = sync.OnceValue(func() overflow {
	uidMap, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return overflow{} // no /proc: trust no one more
	}
	o := overflow{overflow: 65534}
	if b, err := os.ReadFile("/proc/sys/kernel/overflowuid"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			o.overflow = n
		}
	}
	o.unmapped = !mapped(string(uidMap), o.overflow)
	return o
})

// overflow is the kernel's overflow uid, and whether this process's user
// namespace maps no uid to it.
type overflow struct {
	overflow int
	unmapped bool
}

// mapped reports whether uid is inside one of uidMap's ranges
// (/proc/self/uid_map: "inside outside count" a line). A map that does not
// parse maps everything: nothing is trusted on its account.
func mapped(uidMap string, uid int) bool {
	for _, line := range strings.Split(strings.TrimSpace(uidMap), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			return true
		}
		in, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return true
		}
		if int64(uid) >= in && int64(uid) < in+n {
			return true
		}
	}
	return false
}

// maxLinks is the kernel's bound on symlinks followed in one lookup.
const maxLinks = 40

// Walk follows abs, an absolute path, one name at a time as the kernel
// does, and returns it resolved and what on the way an untrusted user can
// change: each directory a name is looked up in (abs's ancestors, and
// those of each symlink's target) owned by a uid trusted does not accept,
// or writable by group or others without the sticky bit; and each symlink
// followed whose owner trusted does not accept (in a sticky directory its
// owner can re-point it). abs itself, once resolved, is not judged: the
// rules for the directory itself are the caller's. Each directory is
// reported once. A missing last name is no error (the resolved path is
// where it would be); any other lookup's error is returned.
func Walk(abs string, trusted func(uid int) bool) (string, []Unsafe, error) {
	if !filepath.IsAbs(abs) {
		return "", nil, fmt.Errorf("%s: not an absolute path", abs)
	}
	var bad []Unsafe
	judged := map[string]bool{}
	cur, todo, links := "/", strings.Split(abs, "/"), 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..": // cur holds no symlink: its parent is the lexical one
			cur = filepath.Dir(cur)
			continue
		}
		if !judged[cur] {
			judged[cur] = true
			fi, err := os.Lstat(cur)
			if err != nil {
				return "", nil, err
			}
			if u, ok := judge(cur, fi, trusted); !ok {
				bad = append(bad, u)
			}
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if len(todo) == 0 && os.IsNotExist(err) {
			return next, bad, nil
		}
		if err != nil {
			return "", nil, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if o := Owner(fi); !trusted(o) {
			bad = append(bad, Unsafe{Path: next, Owner: o, Mode: fi.Mode()})
		}
		if links++; links > maxLinks {
			return "", nil, &fs.PathError{Op: "walk", Path: abs, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", nil, err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, bad, nil
}

// WalkExisting is Walk of the part of abs that exists, before its missing
// levels are made: what an untrusted user can change among the
// directories up to the one abs's first missing level would be made in
// (that one included; all of abs's ancestors when it exists). Judged
// before MkdirAll, a level another user points elsewhere cannot have the
// agent make the rest there.
func WalkExisting(abs string, trusted func(uid int) bool) ([]Unsafe, error) {
	if !filepath.IsAbs(abs) {
		return nil, fmt.Errorf("%s: not an absolute path", abs)
	}
	probe := filepath.Clean(abs) // the first missing level, or abs when it exists
	for p := probe; ; {
		if _, err := os.Lstat(p); err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
		probe = p
		if p = filepath.Dir(p); p == probe {
			break
		}
	}
	_, bad, err := Walk(probe, trusted)
	return bad, err
}

// judge says whether the directory dir (fi) is safe to look names up in.
func judge(dir string, fi fs.FileInfo, trusted func(int) bool) (Unsafe, bool) {
	u := Unsafe{Path: dir, Owner: Owner(fi), Mode: fi.Mode()}
	if !trusted(u.Owner) {
		return u, false
	}
	u.Writable = u.Mode.Perm()&0o022 != 0 && u.Mode&fs.ModeSticky == 0
	return u, !u.Writable
}

// Owner is fi's owner uid (-1: unknown).
func Owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// UIDName is "uid N (name)", the name when the user database has it.
func UIDName(uid int) string {
	s := "uid " + strconv.Itoa(uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		s += " (" + u.Username + ")"
	}
	return s
}
