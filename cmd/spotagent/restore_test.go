package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// stallingStore holds every read of a checkpoint's data (not its .json
// records) until the read's context ends, and says when the first began.
type stallingStore struct {
	cloud.Store
	entered chan struct{}
}

func (s stallingStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if strings.HasSuffix(key, ".json") {
		return s.Store.Get(ctx, key, off, n)
	}
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// stages lists the restore staging directories beside (or in) dest.
func stages(t *testing.T, dest string) []string {
	t.Helper()
	a, _ := filepath.Glob(filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".restore-*"))
	b, _ := filepath.Glob(filepath.Join(dest, ".spotagent-restore-*"))
	return append(a, b...)
}

// TestRestore_SignalCleansUp (issue 36 item 9): Ctrl-C during `spotagent
// restore` used to kill it mid-download (exit -2, no message), leaving its
// staging directory and partial file beside --dest. It now cancels the
// download, removes what it staged, says so and exits 130.
func TestRestore_SignalCleansUp(t *testing.T) {
	_, uri := testStore(t, nil)
	dest := filepath.Join(t.TempDir(), "d")
	entered := make(chan struct{}, 1)
	testHookRestoreStore = func(st cloud.Store) cloud.Store { return stallingStore{Store: st, entered: entered} }
	t.Cleanup(func() { testHookRestoreStore = nil })
	type result struct {
		code        int
		out, errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := cli(t, "restore", "--store", uri, "--dest", dest)
		done <- result{code, out, errOut}
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the restore never started downloading")
	}
	if got := stages(t, dest); len(got) != 1 {
		t.Fatalf("staging directories %v while downloading, want one", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("restore did not end after SIGINT")
	}
	if r.code != 130 || !strings.Contains(r.errOut, "interrupted by SIGINT: nothing restored into "+dest+"; the partial download was removed") {
		t.Fatalf("exit %d, stderr %q; want 130 and the interruption", r.code, r.errOut)
	}
	if got := stages(t, dest); len(got) != 0 {
		t.Fatalf("staging directories %v left after the interruption", got)
	}
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("an interrupted restore created --dest")
	}
}

// TestRestore_RemovesStaleStages (issue 36 item 9): what a killed restore
// left beside --dest (its staging directory and partial download) is
// removed by the next restore into that --dest; other users' directories
// and names that are not a restore's are left alone.
func TestRestore_RemovesStaleStages(t *testing.T) {
	_, uri := testStore(t, nil)
	parent := t.TempDir()
	dest := filepath.Join(parent, "d")
	mine := filepath.Join(parent, ".d.restore-123456")
	theirs := filepath.Join(parent, ".d.restore-654321")
	other := filepath.Join(parent, ".d.restore-notes")
	for _, d := range []string{mine, theirs, other} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, ".partial-model.pt"), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	} else {
		theirs = "" // cannot make another user's here
	}
	if code, out, errOut := cli(t, "restore", "--store", uri, "--dest", dest); code != 0 || !strings.Contains(out, "restored step 42") {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Fatalf("a stale staging directory of this user was kept: %v", err)
	}
	for _, keep := range []string{theirs, other} {
		if keep == "" {
			continue
		}
		if _, err := os.Stat(keep); err != nil {
			t.Fatalf("%s was removed: %v", keep, err)
		}
	}
}
