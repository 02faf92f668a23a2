package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// exitInterrupted is the documented "interrupted, run me again" code.
const exitInterrupted = 75

// TestRun_GrandchildDiesWithAgent: spotagent run -- sh -c "python3 ...; echo",
// the agent SIGKILLed: the python grandchild goes too (Pdeathsig alone
// would leave it running under PID 1).
func TestRun_GrandchildDiesWithAgent(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	pidFile := filepath.Join(dir, "py.pid")
	script := strings.Join(fakeTrainer("--no-socket", "--pid-file", pidFile), " ") + "; echo"
	p := start(t, nil, "run", "--store", "file://"+filepath.Join(dir, "store"), "--run-id", "gc",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--cloud", "none", "--interval", "1h", "--", "/bin/sh", "-c", script)
	var pid int
	testutil.WaitWithin(t, "the python grandchild's pid", time.Minute, func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return pid > 0
	})
	p.signal(syscall.SIGKILL)
	p.wait(time.Minute)
	testutil.WaitWithin(t, "the grandchild to be gone", 30*time.Second, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		s := string(b)
		return strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
	})
}
