package main

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestRestore_DiskFull: `spotagent restore` of a 3 MiB checkpoint onto a
// 2 MiB disk (a tmpfs: the test needs root, as CI runs it, and fails
// without) fails with the cause (no space left on device), leaves nothing
// in --dest nor staged beside it, and leaves the store untouched. (The
// end-to-end TestDisk_FullWhileRestoring's first half until #49; its
// second, the agent's restore at start, is pkg/supervisor's
// TestAgent_DiskFullWhileRestoring.)
func TestRestore_DiskFull(t *testing.T) {
	dir := testutil.ShortDir(t)
	storeDir := filepath.Join(dir, "store")
	st, err := file.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	big := make([]byte, 3<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "state.bin"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&commit.Committer{Store: st, RunID: "exp1"}).Commit(t.Context(), commit.Request{Dir: src, ID: "d15c00000007", Step: 7}); err != nil {
		t.Fatal(err)
	}
	before := testutil.StoreSnapshot(t, storeDir)
	dest := filepath.Join(dir, "dest")
	testutil.MountTmpfs(t, dest, "2m")

	code, out, errOut := cli(t, "restore", "--store", "file://"+storeDir, "--dest", dest)
	if code == 0 {
		t.Fatalf("restore onto a full disk exited 0\n%s%s", out, errOut)
	}
	if !regexp.MustCompile(`spotagent restore: .*no space left on device`).MatchString(errOut) {
		t.Fatalf("exit %d, stderr %q: want spotagent restore: ... no space left on device", code, errOut)
	}
	testutil.RequireEmptyDir(t, dest)
	if got := stages(t, dest); len(got) != 0 {
		t.Fatalf("staging directories %v left after the failed restore", got)
	}
	testutil.SameStoreSnapshot(t, before, testutil.StoreSnapshot(t, storeDir))
}
