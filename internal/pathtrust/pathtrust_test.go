package pathtrust

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
)

const nobody = 65534

// mkdir makes p with mode (past the umask) owned by uid.
func mkdir(t *testing.T, p string, mode fs.FileMode, uid int) {
	t.Helper()
	testutil.MkdirOwned(t, p, mode, uid)
}

// TestWalk: what a user other than root or the agent can change on the
// way to a path is found: a directory of theirs, a directory writable by
// others without the sticky bit, a symlink of theirs, and a directory on
// the way to a symlink's target; a root-owned sticky directory like /tmp
// is not. The path itself is not judged, and a missing last name is
// where it would be.
func TestWalk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the directories belong to uid 65534")
	}
	base := t.TempDir() // below /tmp: root's and sticky
	if err := os.Chmod(base, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	hers, open, mine := filepath.Join(base, "hers"), filepath.Join(base, "open"), filepath.Join(base, "mine")
	mkdir(t, hers, 0o755, nobody)
	mkdir(t, open, 0o777, 0)
	mkdir(t, mine, 0o700, 0)
	for _, d := range []string{filepath.Join(hers, "ckpt"), filepath.Join(open, "ckpt")} {
		mkdir(t, d, 0o700, 0)
	}
	mkdir(t, filepath.Join(mine, "ckpt"), 0o777, nobody) // the path itself: the caller's to judge
	if err := os.Symlink(filepath.Join(hers, "ckpt"), filepath.Join(mine, "to-hers")); err != nil {
		t.Fatal(err)
	}
	herLink := filepath.Join(base, "her-link")
	if err := os.Symlink("mine", herLink); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(herLink, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../mine/./ckpt", filepath.Join(mine, "rel")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, resolved string
		want                 []Unsafe // Path, Owner, Writable
	}{
		{"sticky like /tmp", filepath.Join(mine, "ckpt"), filepath.Join(mine, "ckpt"), nil},
		{"missing last name", filepath.Join(mine, "new"), filepath.Join(mine, "new"), nil},
		{"relative link", filepath.Join(mine, "rel"), filepath.Join(mine, "ckpt"), nil},
		{"directory of another user", filepath.Join(hers, "ckpt"), filepath.Join(hers, "ckpt"), []Unsafe{{Path: hers, Owner: nobody}}},
		{"writable without sticky", filepath.Join(open, "ckpt"), filepath.Join(open, "ckpt"), []Unsafe{{Path: open, Owner: 0, Writable: true}}},
		{"link into another user's directory", filepath.Join(mine, "to-hers"), filepath.Join(hers, "ckpt"), []Unsafe{{Path: hers, Owner: nobody}}},
		{"link of another user", filepath.Join(herLink, "ckpt"), filepath.Join(mine, "ckpt"), []Unsafe{{Path: herLink, Owner: nobody}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			resolved, bad, err := Walk(c.path, Trusted)
			if err != nil {
				t.Fatal(err)
			}
			if resolved != c.resolved {
				t.Errorf("resolved %s, want %s", resolved, c.resolved)
			}
			if len(bad) != len(c.want) {
				t.Fatalf("found %v, want %v", bad, c.want)
			}
			for i, u := range bad {
				if w := c.want[i]; u.Path != w.Path || u.Owner != w.Owner || u.Writable != w.Writable {
					t.Errorf("found %+v, want %+v", u, w)
				}
			}
		})
	}
	_, bad, _ := Walk(filepath.Join(hers, "ckpt"), Trusted)
	if got := bad[0].Error(); !strings.Contains(got, hers+" is owned by uid 65534") {
		t.Errorf("Error() = %q, want it to name the directory and its owner", got)
	}
	_, bad, _ = Walk(filepath.Join(open, "ckpt"), Trusted)
	if got := bad[0].Error() + "; " + bad[0].Fix(); !strings.Contains(got, "without the sticky bit") || !strings.Contains(got, "chmod +t "+open) {
		t.Errorf("Error() and Fix() = %q, want the sticky bit and chmod +t", got)
	}
	if _, _, err := Walk("rel/ckpt", Trusted); err == nil {
		t.Error("a relative path was walked")
	}
	if _, _, err := Walk(filepath.Join(base, "gone", "ckpt"), Trusted); err == nil {
		t.Error("a missing directory on the way was no error")
	}
	loop := filepath.Join(mine, "loop")
	if err := os.Symlink("loop", loop); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Walk(filepath.Join(loop, "x"), Trusted); err == nil {
		t.Error("a symlink loop was no error")
	}
}

// An owner is outside the agent's user namespace when it is the overflow
// uid and the namespace maps no uid to it: `unshare -r` (one uid mapped)
// and Apptainer show the host's root that way, so /, /tmp and $HOME's
// parents were refused; in the first namespace (every uid mapped) 65534
// is nobody, an ordinary user, refused as ever.
func TestMapped(t *testing.T) {
	for _, c := range []struct {
		uidMap string
		uid    int
		want   bool
	}{
		{"         0          0 4294967295\n", 65534, true},  // the first namespace
		{"         0       1000          1\n", 65534, false}, // unshare -r
		{"         0       1000          1\n", 0, true},
		{"0 1000 1\n1 100000 65536\n", 65534, true}, // rootless podman: 1..65536 mapped
		{"0 1000 1\n1 100000 65533\n", 65534, false},
		{"garbage\n", 65534, true}, // unreadable: nothing trusted on its account
	} {
		if got := mapped(c.uidMap, c.uid); got != c.want {
			t.Errorf("mapped(%q, %d) = %v, want %v", c.uidMap, c.uid, got, c.want)
		}
	}
	// This test runs in the first namespace (CI, make test): nobody is
	// nobody, not an owner outside.
	if b, err := os.ReadFile("/proc/self/uid_map"); err == nil && mapped(string(b), 65534) && Outside(65534) {
		t.Fatal("uid 65534 trusted as outside the namespace, though the namespace maps it")
	}
}
