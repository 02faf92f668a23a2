package testutil

import (
	"os"
	"syscall"
	"testing"
)

// MountTmpfs mounts a tmpfs of size (e.g. "2m") on dir for the test: a
// disk that fills up. It needs root (CI runs the tests as root) and fails
// the test, never skips it, without.
func MountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test mounts a %s tmpfs to fill a disk and must run as root (uid %d), as CI does", size, os.Geteuid())
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v (the disk-full tests need mount(2): root with CAP_SYS_ADMIN)", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}
