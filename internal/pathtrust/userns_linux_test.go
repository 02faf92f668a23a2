package pathtrust

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// In a user namespace that maps one uid (as `unshare -r` does), the
// host's root shows as the overflow uid: the walk to a path under
// t.TempDir() (root's /, /tmp) reports nothing, where it reported every
// directory on the way as owned by nobody. The child is this test binary
// again, in a new user namespace (TestMain).
func TestWalk_InAUserNamespace(t *testing.T) {
	// Root's, 0700: the child (host uid 4242) could enter neither it nor
	// the build's directory, where this binary is: a copy goes there.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pathtrust.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), userNSChild+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 4242, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 4242, Size: 1}},
		Credential:  &syscall.Credential{Uid: 0, Gid: 0}, // uid 0 inside: host uid 4242
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child in a user namespace: %v\n%s (this test needs unprivileged user namespaces or root, as CI has)", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "euid=0 outside=true unsafe=[]" {
		t.Fatalf("in a user namespace mapping one uid: %s, want 65534 outside and nothing unsafe on the way to %s", got, dir)
	}
}

// userNSChild names the directory the child walks to.
const userNSChild = "PATHTRUST_USERNS_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(userNSChild); dir != "" {
		_, bad, err := Walk(dir+"/ckpt", Trusted)
		if err != nil {
			fmt.Println("walk:", err)
			os.Exit(1)
		}
		fmt.Printf("euid=%d outside=%v unsafe=%v\n", os.Geteuid(), Outside(nobody), bad)
		os.Exit(0)
	}
	os.Exit(m.Run())
}
