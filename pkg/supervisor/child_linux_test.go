package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestChild_DiesWithAgent(t *testing.T) {
	pidFile := filepath.Join(shortDir(t), "pid")
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(os.Environ(), parentHelperEnv+"="+pidFile)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	deadline := time.Now().Add(testWait)
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("helper agent did not start its child")
		}
		time.Sleep(10 * time.Millisecond) // polling for the pid file, bounded by deadline
	}
	agent.Process.Signal(syscall.SIGKILL)
	agent.Wait()
	for syscall.Kill(pid, 0) == nil {
		if stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(stat), ") Z ") {
			break // killed, waiting to be reaped by init
		}
		if time.Now().After(deadline) {
			t.Fatalf("trainer %d still running after its agent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling for the process to go, bounded by deadline
	}
}
