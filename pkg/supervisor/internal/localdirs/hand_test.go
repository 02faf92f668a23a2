package localdirs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// handFixture is an agent's directories (run "r") below a directory other
// uids may enter, with a restored checkpoint as FetchRestore leaves it:
// restore/<name>/ (0700) with model.pt and sub/opt.pt (0600), and the
// manifest copy beside it (0600), all root's.
func handFixture(t *testing.T) (d Dirs, dir, manifest string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: hands files to uid 65534")
	}
	base := testutil.ShortDir(t)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := Open(nil, filepath.Join(base, "ckpt"), "r", false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	dir = filepath.Join(d.RestoreDir(), "000000000007-abc")
	manifest = dir + ".manifest.json"
	for p, data := range map[string]string{"model.pt": "weights", "sub/opt.pt": "moments"} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(manifest, []byte(`{"step": 7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return d, dir, manifest
}

// asUID runs name args as uid (and gid) uid: nil when it exits 0.
func asUID(uid int, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd.Run()
}

// statOf is p's owner and mode (lstat).
func statOf(t *testing.T, p string) (int, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return ownerUID(fi), fi.Mode()
}

// TestHandRestore: a restored checkpoint handed to uid 65534 is its own to
// read and no one else's: its top directory 65534's 0500, everything in it
// root's and read-only, the manifest copy 65534's 0400, the agent's
// directories above it searchable only. 65534 reads every file but writes,
// chmods, adds nothing; 65533 reads and lists nothing. Handing it again to
// 65534 does nothing; to another uid, it is refused.
func TestHandRestore(t *testing.T) {
	const uid, third = 65534, 65533
	d, dir, manifest := handFixture(t)
	if err := d.HandRestore(dir, manifest, uid); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path  string
		owner int
		mode  os.FileMode
	}{
		{dir, uid, os.ModeDir | 0o500},
		{filepath.Join(dir, "model.pt"), 0, 0o444},
		{filepath.Join(dir, "sub"), 0, os.ModeDir | 0o555},
		{filepath.Join(dir, "sub", "opt.pt"), 0, 0o444},
		{manifest, uid, 0o400},
		{d.RestoreDir(), 0, os.ModeDir | 0o711},
		{d.AreaPath, 0, os.ModeDir | 0o711},
		{d.Path, 0, os.ModeDir | 0o711},
	} {
		if owner, mode := statOf(t, c.path); owner != c.owner || mode != c.mode {
			t.Errorf("%s: owner %d mode %v, want %d %v", c.path, owner, mode, c.owner, c.mode)
		}
	}
	model, opt := filepath.Join(dir, "model.pt"), filepath.Join(dir, "sub", "opt.pt")
	for _, args := range [][]string{{"cat", model, opt, manifest}, {"ls", dir, filepath.Join(dir, "sub")}} {
		if err := asUID(uid, args[0], args[1:]...); err != nil {
			t.Errorf("uid %d: %v: %v, want allowed", uid, args, err)
		}
	}
	for _, c := range []struct {
		uid  int
		args []string
	}{
		{uid, []string{"sh", "-c", `echo x >> "$0"`, model}},
		{uid, []string{"chmod", "644", model}},
		{uid, []string{"sh", "-c", `echo x > "$0"/new`, filepath.Join(dir, "sub")}},
		{uid, []string{"ls", d.RestoreDir()}},
		{third, []string{"cat", model}},
		{third, []string{"ls", dir}},
		{third, []string{"cat", manifest}},
	} {
		if err := asUID(c.uid, c.args[0], c.args[1:]...); err == nil {
			t.Errorf("uid %d: %v allowed, want denied", c.uid, c.args)
		}
	}
	if b, err := os.ReadFile(model); err != nil || string(b) != "weights" {
		t.Fatalf("model.pt after the tries: %q %v", b, err)
	}
	if err := d.HandRestore(dir, manifest, uid); err != nil {
		t.Fatalf("handing again to the same uid: %v", err)
	}
	if err := d.HandRestore(dir, manifest, third); !errors.Is(err, checkpoint.ErrRefused) {
		t.Fatalf("handing to uid %d what uid %d holds: %v, want refused", third, uid, err)
	}
}

// TestHandRestore_Refused: a symlink in the restored tree stops the
// hand-over before the top directory is given away (and its target is
// left alone); a path outside the restore area is refused.
func TestHandRestore_Refused(t *testing.T) {
	d, dir, manifest := handFixture(t)
	target := filepath.Join(filepath.Dir(d.Path), "target")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	if err := d.HandRestore(dir, manifest, 65534); err == nil {
		t.Fatal("a tree holding a symlink was handed over")
	}
	if owner, mode := statOf(t, dir); owner != 0 || mode.Perm() != 0o700 {
		t.Fatalf("top directory after the refusal: owner %d mode %v, want root's 0700", owner, mode)
	}
	if owner, mode := statOf(t, target); owner != 0 || mode.Perm() != 0o600 {
		t.Fatalf("the symlink's target was changed: owner %d mode %v", owner, mode)
	}
	for _, p := range []string{filepath.Join(d.AreaPath, TierSub), filepath.Join(dir, "sub"), "/etc"} {
		if err := d.HandRestore(p, "", 65534); !errors.Is(err, checkpoint.ErrRefused) {
			t.Errorf("HandRestore(%s): %v, want refused", p, err)
		}
	}
}

// TestDropHanded: a restore deletes what an earlier start handed to a
// trainer's uid (it may have changed it), keeping the agent's own entries.
func TestDropHanded(t *testing.T) {
	d, dir, manifest := handFixture(t)
	own := filepath.Join(d.RestoreDir(), "000000000005-def")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.HandRestore(dir, manifest, 65534); err != nil {
		t.Fatal(err)
	}
	rest, err := checkpoint.OpenDir(d.Area, RestoreSub)
	if err != nil {
		t.Fatal(err)
	}
	defer rest.Close()
	dropHanded(rest)
	for _, p := range []string{dir, manifest} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s handed earlier is still there: %v", p, err)
		}
	}
	if _, err := os.Lstat(own); err != nil {
		t.Errorf("the agent's own entry was deleted: %v", err)
	}
}
