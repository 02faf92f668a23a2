package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
)

// nobody is the other user these tests play (mallory): root makes her
// directories and hands them to her uid, as her own mkdir would leave them.
const nobody = 65534

// herDir makes dir with mode, owned by nobody.
func herDir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	testutil.MkdirOwned(t, dir, mode, nobody)
}

// sharedTmp is a directory like /tmp: root's, sticky, writable by all.
func sharedTmp(t *testing.T) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOwner_StoreOfAnotherUserRefused (security review item 1): mallory
// runs `mkdir -m777 /tmp/sa-store` (the README's example path), or puts a
// symlink there into a directory of hers, and plants latest.json; alice's
// run, list and restore used it. Every command now refuses, naming the
// path, the owner and what to do, before it reads anything (and run before
// its trainer starts). A store of hers that only she can write may be
// read. (Moved from the end-to-end tests in #49: the refusal is the CLI's,
// before any process is started.)
func TestOwner_StoreOfAnotherUserRefused(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	dir := sharedTmp(t)
	open, hers, link := filepath.Join(dir, "sa-store"), filepath.Join(dir, "hers"), filepath.Join(dir, "link")
	herDir(t, open, 0o777)
	herDir(t, hers, 0o755)
	if err := os.Symlink(hers, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{open, hers} {
		p := filepath.Join(d, "latest.json")
		if err := os.WriteFile(p, []byte(`{"planted": true}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	ran := filepath.Join(dir, "trainer-ran")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"run, world-writable", []string{"run", "--store", "file://" + open, "--cloud", "none", "--checkpoint-dir", filepath.Join(dir, "ckpt"), "--", "touch", ran}, "(mode drwxrwxrwx) is owned by uid 65534"},
		{"run, symlink into hers", []string{"run", "--store", "file://" + link, "--cloud", "none", "--checkpoint-dir", filepath.Join(dir, "ckpt"), "--", "touch", ran}, "owned by uid 65534"},
		{"list, world-writable", []string{"list", "--store", "file://" + open}, "writable by group or others"},
		{"restore, world-writable", []string{"restore", "--store", "file://" + open, "--dest", filepath.Join(dir, "dest")}, "writable by group or others"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := cli(t, c.args...)
			if code == 0 || !strings.Contains(errOut, "untrusted store directory") || !strings.Contains(errOut, c.want) {
				t.Fatalf("spotagent %s: exit %d, want a refusal naming %q:\n%s%s", c.args[0], code, c.want, out, errOut)
			}
		})
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the trainer was started on an untrusted store: %v", err)
	}
	// Hers, writable by her alone: as trustworthy as she is. list reads it
	// and fails on the planted pointer, not on trust.
	if _, out, errOut := cli(t, "list", "--store", "file://"+hers); strings.Contains(out+errOut, "untrusted store directory") {
		t.Fatalf("list of a store another user owns and only they can write was refused:\n%s%s", out, errOut)
	}
}

// TestOwner_CheckpointAreaOfAnotherUserRefused (security review item 2):
// mallory runs `mkdir -m777 /tmp/ckpt /tmp/ckpt/spotagent-RUN`; alice's
// run adopted the empty area and her trainer wrote its checkpoint where
// mallory could read and change it. The run now refuses before starting
// the trainer; so does a --checkpoint-dir others can write without the
// sticky bit (they could rename the area away), and one below a directory
// of another user's or one others can write without the sticky bit
// (hostile-user trial: they renamed the checkpoint dir away and the root
// trainer wrote into theirs, then restored what they planted). (Moved
// from the end-to-end tests in #49.)
func TestOwner_CheckpointAreaOfAnotherUserRefused(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	dir := sharedTmp(t)
	ckpt := filepath.Join(dir, "ckpt")
	herDir(t, ckpt, 0o777)
	herDir(t, filepath.Join(ckpt, "spotagent-own"), 0o777)
	// Root's, sticky like /tmp: only the area inside is hers.
	sticky, open := filepath.Join(dir, "sticky"), filepath.Join(dir, "open")
	for d, mode := range map[string]os.FileMode{sticky: os.ModeSticky | 0o777, open: 0o777} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	herDir(t, filepath.Join(sticky, "spotagent-own"), 0o777)
	// The hostile-user trial's layout: nobody's /tmp/hx-evil, root's ckpt in it.
	evil := filepath.Join(dir, "hx-evil")
	herDir(t, evil, 0o755)
	ran := filepath.Join(dir, "trainer-ran")
	for _, c := range []struct{ name, ckpt, want string }{
		{"checkpoint dir and area of another user", ckpt, "owned by uid 65534"},
		{"area of another user in a sticky dir", sticky, "spotagent-own: owned by uid 65534"},
		{"writable checkpoint dir without the sticky bit", open, "without the sticky bit"},
		{"parent of another user", filepath.Join(evil, "ckpt"), evil + " is owned by uid 65534"},
		{"parent writable without the sticky bit", filepath.Join(open, "ckpt"), open + " is writable by group or others without the sticky bit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := cli(t, "run", "--store", "file://"+filepath.Join(dir, "store"), "--cloud", "none",
				"--run-id", "own", "--checkpoint-dir", c.ckpt, "--", "touch", ran)
			if code == 0 || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, c.ckpt) {
				t.Fatalf("spotagent run: exit %d, want a refusal naming %s and %q:\n%s%s", code, c.ckpt, c.want, out, errOut)
			}
		})
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the trainer was started: %v", err)
	}
	for _, d := range []string{ckpt, sticky} {
		if _, err := os.Lstat(filepath.Join(d, "spotagent-own", ".spotagent-run")); !os.IsNotExist(err) {
			t.Fatalf("the agent wrote into the other user's area: %v", err)
		}
	}
	for _, d := range []string{open, filepath.Join(open, "ckpt"), filepath.Join(evil, "ckpt")} {
		if _, err := os.Lstat(filepath.Join(d, "spotagent-own")); !os.IsNotExist(err) {
			t.Fatalf("the agent made its area in a directory others can rename it out of: %v", err)
		}
	}
}
