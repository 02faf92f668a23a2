package child

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
)

// TestTree: a shell, a child of its own in a session of its own (setsid,
// as torch 2.x's torchrun starts its ranks) and that child's child are all
// found below the shell, the shell first; an unrelated process is not.
func TestTree(t *testing.T) {
	cmd := exec.Command("sh", "-c", `setsid sh -c 'sleep 60 & echo $!; wait' & wait`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range Tree(cmd.Process.Pid) {
			syscall.Kill(p, syscall.SIGKILL)
		}
		other.Process.Kill()
		cmd.Wait()
		other.Wait()
	})
	buf := make([]byte, 64)
	n, err := out.Read(buf) // the grandchild's pid, once it runs
	if err != nil {
		t.Fatal(err)
	}
	sleeper, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("pid %q: %v", buf[:n], err)
	}
	var got []int
	testutil.WaitFor(t, "the tree of three", func() bool {
		got = Tree(cmd.Process.Pid)
		return len(got) >= 3 && slices.Contains(got, sleeper)
	})
	if got[0] != cmd.Process.Pid {
		t.Fatalf("tree %v does not start at the shell %d", got, cmd.Process.Pid)
	}
	if slices.Contains(got, other.Process.Pid) {
		t.Fatalf("tree %v holds the unrelated process %d", got, other.Process.Pid)
	}
	if len(got) != 3 {
		t.Fatalf("tree %v, want the shell, the setsid shell and its sleep", got)
	}
}
