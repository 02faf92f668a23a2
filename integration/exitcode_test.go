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
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// exitInterrupted is the documented "interrupted, run me again" code.
const exitInterrupted = 75

func exitArgs(dir string, fk *fake.AWS, extra ...string) []string {
	args := []string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "exit",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--cloud", "aws", "--aws-imds-endpoint", fk.URL(), "--poll-interval", "100ms",
		"--interval", "1h", "--log-format", "json", "--log-level", "info"}
	return append(args, extra...)
}

// TestExitCode_Notice: after a spot notice the trainer (the Python client's
// agent.exit_code) exits 75 and so does spotagent run; a run without a
// notice ends 0 for both.
func TestExitCode_Notice(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	t.Run("notice", func(t *testing.T) {
		dir := testutil.ShortDir(t)
		fk := fake.NewAWS(fake.AWSOptions{})
		t.Cleanup(fk.Close)
		p := start(t, nil, append(exitArgs(dir, fk), "--", python, "python/examples/train.py",
			"--steps", "100000", "--step-time", "0.01")...)
		p.waitLine(`^step 25 `, time.Minute) // the trainer is connected and training
		fk.Terminate("terminate", time.Now().Add(2*time.Minute))
		p.waitLine(`stopping at step`, time.Minute)
		tr := p.waitEntry("trainer exited", time.Minute, nil)
		if got := tr.num("code"); got != exitInterrupted {
			t.Fatalf("trainer exit code %d, want %d", got, exitInterrupted)
		}
		if code := p.wait(time.Minute); code != exitInterrupted {
			t.Fatalf("spotagent run exit code %d, want %d", code, exitInterrupted)
		}
	})
	t.Run("no notice", func(t *testing.T) {
		dir := testutil.ShortDir(t)
		fk := fake.NewAWS(fake.AWSOptions{})
		t.Cleanup(fk.Close)
		p := start(t, nil, append(exitArgs(dir, fk), "--", python, "python/examples/train.py",
			"--steps", "20", "--step-time", "0")...)
		if code := p.wait(time.Minute); code != 0 {
			t.Fatalf("spotagent run exit code %d, want 0", code)
		}
		if got := p.waitEntry("trainer exited", time.Minute, nil).num("code"); got != 0 {
			t.Fatalf("trainer exit code %d, want 0", got)
		}
	})
}

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
