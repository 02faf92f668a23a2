package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// TestOwner_StoreOfAnotherUserRefused (security review item 1): mallory
// runs `mkdir -m777 /tmp/sa-store` (the README's example path), or puts a
// symlink there into a directory of hers, and plants latest.json; alice's
// run, list and restore used it. Every command now refuses, naming the
// path, the owner and what to do, before it reads anything.
func TestOwner_StoreOfAnotherUserRefused(t *testing.T) {
	parallel(t)
	if os.Geteuid() != 0 {
		t.Fatalf("this test plays another uid and must run as root (uid %d), as CI does", os.Geteuid())
	}
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil { // like /tmp
		t.Fatal(err)
	}
	open := filepath.Join(dir, "sa-store")
	hers := filepath.Join(dir, "hers")
	link := filepath.Join(dir, "link")
	asNobody(t, `
import os, sys
os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)
os.mkdir(sys.argv[2]); os.chmod(sys.argv[2], 0o755)
os.symlink(sys.argv[2], sys.argv[3])
for d in sys.argv[1:3]:
    open(os.path.join(d, "latest.json"), "w").write('{"planted": true}')
`, open, hers, link)
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
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, agentBin(t), c.args...)
			cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("spotagent %s succeeded:\n%s", strings.Join(c.args, " "), out)
			}
			if !strings.Contains(string(out), "untrusted store directory") || !strings.Contains(string(out), c.want) {
				t.Fatalf("spotagent %s: %v, want a refusal naming %q:\n%s", c.args[0], err, c.want, out)
			}
		})
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the trainer was started on an untrusted store: %v", err)
	}
	// A store of hers that only she can write may be read (it is as
	// trustworthy as she is): list reads it, and fails on the planted
	// pointer, not on trust.
	cmd := exec.Command(agentBin(t), "list", "--store", "file://"+hers)
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	if out, _ := cmd.CombinedOutput(); strings.Contains(string(out), "untrusted store directory") {
		t.Fatalf("list of a store another user owns and only they can write was refused:\n%s", out)
	}
}

// TestOwner_CheckpointAreaOfAnotherUserRefused (security review item 2):
// mallory runs `mkdir -m777 /tmp/ckpt /tmp/ckpt/spotagent-RUN`; alice's
// run adopted the empty area and her trainer wrote its checkpoint where
// mallory could read and change it. The run now refuses before starting
// the trainer; so does a --checkpoint-dir others can write without the
// sticky bit (they could rename the area away).
func TestOwner_CheckpointAreaOfAnotherUserRefused(t *testing.T) {
	parallel(t)
	if os.Geteuid() != 0 {
		t.Fatalf("this test plays another uid and must run as root (uid %d), as CI does", os.Geteuid())
	}
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil { // like /tmp
		t.Fatal(err)
	}
	ckpt := filepath.Join(dir, "ckpt")
	asNobody(t, `
import os, sys
for d in sys.argv[1:]:
    os.mkdir(d); os.chmod(d, 0o777)
`, ckpt, filepath.Join(ckpt, "spotagent-own"))
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
	asNobody(t, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", filepath.Join(sticky, "spotagent-own"))
	ran := filepath.Join(dir, "trainer-ran")
	for _, c := range []struct{ name, ckpt, want string }{
		{"checkpoint dir and area of another user", ckpt, "owned by uid 65534"},
		{"area of another user in a sticky dir", sticky, "spotagent-own: owned by uid 65534"},
		{"writable checkpoint dir without the sticky bit", open, "without the sticky bit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, agentBin(t), "run", "--store", "file://"+filepath.Join(dir, "store"), "--cloud", "none",
				"--run-id", "own", "--checkpoint-dir", c.ckpt, "--", "touch", ran)
			cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), c.ckpt) {
				t.Fatalf("spotagent run: %v, want a refusal naming %s and %q:\n%s", err, c.ckpt, c.want, out)
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
	if _, err := os.Lstat(filepath.Join(open, "spotagent-own")); !os.IsNotExist(err) {
		t.Fatalf("the agent made its area in a directory others can rename it out of: %v", err)
	}
}
