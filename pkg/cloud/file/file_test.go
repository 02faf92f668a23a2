package file_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

func TestConformance(t *testing.T) {
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		st, err := file.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

func TestCleanup(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, "ck/a", strings.NewReader("a"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// What a writer killed between create and rename leaves behind.
	for _, p := range []string{".spotagent-tmp-123", "ck/.spotagent-tmp-456"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.Cleanup(ctx)
	if err != nil || n != 2 {
		t.Fatalf("cleanup=%d, %v; want 2, nil", n, err)
	}
	if n, _ := st.Cleanup(ctx); n != 0 {
		t.Fatalf("second cleanup=%d, want 0", n)
	}
	if _, err := st.Stat(ctx, "ck/a"); err != nil {
		t.Fatalf("cleanup removed an object: %v", err)
	}
}

func TestReservedAndInvalidKeys(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", "/abs", "a/../b", "./a", "a//b", ".spotagent-tmp-x", "d/.spotagent-lock"} {
		if err := st.Put(context.Background(), k, strings.NewReader("x"), 1, cloud.PutOptions{}); err == nil {
			t.Errorf("put %q succeeded, want an error", k)
		}
	}
}

func TestURI(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.URI("a/b"), "file://"+dir+"/a/b"; got != want {
		t.Fatalf("URI=%q, want %q", got, want)
	}
}

// With options, cleanup removes only the temp files the options own, and
// those older than MaxAge: another agent's writes in flight are spared.
func TestCleanup_Owned(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join("ck", "node-1", ".spotagent-tmp-1")
	theirs := filepath.Join("ck", "node-0", ".spotagent-tmp-2")
	old := filepath.Join("ck", "node-0", ".spotagent-tmp-3")
	for _, p := range []string{mine, theirs, old} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(filepath.Join(dir, old), day, day); err != nil {
		t.Fatal(err)
	}
	opts := cloud.CleanupOptions{Owned: func(key string) bool { return strings.HasPrefix(key, "ck/node-1/") }}
	if n, err := st.Cleanup(context.Background(), opts); err != nil || n != 2 {
		t.Fatalf("cleanup=%d, %v; want 2, nil", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, theirs)); err != nil {
		t.Fatalf("cleanup removed another writer's temp file: %v", err)
	}
}

// TestModes (issue 36 item 3): what the store creates is its owner's only
// (directories 0700, objects and the lock file 0600), so that another user
// can neither read checkpoints nor hold the lock. Was: 0755 and 0644.
func TestModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, "a/b/c", strings.NewReader("x"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	info, err := st.Stat(ctx, "a/b/c")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, "a/b/c", strings.NewReader("y"), 1, cloud.PutOptions{IfVersion: info.Version}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"": 0o700, "a": 0o700, "a/b": 0o700, "a/b/c": 0o600, ".spotagent-lock": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%q: mode %v, want %v", p, got, want)
		}
	}
}

// TestLock_BoundedByContext (issue 36 item 3): a process that holds the
// store's lock forever used to hang every compare-and-swap (latest.json,
// the journal) in a blocking flock that ignored its context, and the
// agent's exit with it. The Put now fails when its context ends.
func TestLock_BoundedByContext(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, "latest.json", strings.NewReader("x"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	info, err := st.Stat(ctx, "latest.json")
	if err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(filepath.Join(dir, ".spotagent-lock"), os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- st.Put(short, "latest.json", strings.NewReader("y"), 1, cloud.PutOptions{IfVersion: info.Version})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "store lock ") || !strings.Contains(err.Error(), "held by another process") {
			t.Fatalf("put under a held lock: %v, want the deadline, saying the lock is held", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("put under a held lock did not end with its context")
	}
	// Released, the next one goes through.
	syscall.Flock(int(holder.Fd()), syscall.LOCK_UN)
	if err := st.Put(ctx, "latest.json", strings.NewReader("y"), 1, cloud.PutOptions{IfVersion: info.Version}); err != nil {
		t.Fatal(err)
	}
}

// TestLock_SymlinkRefused: a symlink at the lock's place is not followed
// (it could make an agent running as root create a file elsewhere).
func TestLock_SymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Symlink(target, filepath.Join(dir, ".spotagent-lock")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, "k", strings.NewReader("x"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	info, _ := st.Stat(ctx, "k")
	if err := st.Put(ctx, "k", strings.NewReader("y"), 1, cloud.PutOptions{IfVersion: info.Version}); err == nil {
		t.Fatal("a compare-and-swap through a symlinked lock succeeded")
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lock's symlink was followed: %v", err)
	}
}

// TestTrust_OtherUsersStoreRefused (security review, item 1): mallory
// pre-creates the README's example path 0777 (or a symlink there into
// her own directory) and plants latest.json; the agent used it silently.
// A store another user can change is refused, for writing and, when
// others can write it, for reading; a store another user owns that only
// they can write may be read (it is as trustworthy as its owner).
func TestTrust_OtherUsersStoreRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store belongs to uid 65534")
	}
	const mallory = 65534
	base := t.TempDir() // 0700, root's, under sticky /tmp
	mk := func(name string, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(base, name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	worldWritable := mk("sa-store", 0o777, mallory)
	hers := mk("hers", 0o755, mallory)
	mine777 := mk("mine777", 0o777, 0)
	mk("above", 0o755, mallory)
	under := mk("above/store", 0o700, 0)
	mk("sticky", os.ModeSticky|0o777, 0)
	inSticky := mk("sticky/store", 0o700, 0)
	link := filepath.Join(base, "link")
	if err := os.Symlink(hers, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dir   string
		write, read bool // accepted?
		errHas      string
	}{
		{"world-writable, another user's", worldWritable, false, false, "owned by uid 65534"},
		{"another user's, only theirs", hers, false, true, "owned by uid 65534"},
		{"symlink to another user's", link, false, true, "-> " + hers},
		{"own but world-writable", mine777, false, false, "mode drwxrwxrwx"},
		{"own, below another user's directory", under, false, false, "above the store"},
		{"own, below a sticky directory", inSticky, true, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := file.New(c.dir)
			if c.write != (err == nil) {
				t.Fatalf("New(%s): %v, accepted want %v", c.dir, err, c.write)
			}
			if err != nil {
				if !errors.Is(err, file.ErrUntrusted) || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("New: %v, want ErrUntrusted naming %q", err, c.errHas)
				}
			} else if real, _ := filepath.EvalSymlinks(c.dir); st.Root() != real {
				t.Fatalf("root %s, want the resolved %s", st.Root(), real)
			}
			_, err = file.Open(c.dir)
			if c.read != (err == nil) {
				t.Fatalf("Open(%s): %v, accepted want %v", c.dir, err, c.read)
			}
			if err != nil && !errors.Is(err, file.ErrUntrusted) {
				t.Fatalf("Open: %v, want ErrUntrusted", err)
			}
		})
	}
}
