package child

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// The test binary can be a guard too: Start re-runs /proc/self/exe.
func init() { RunGuardIfAsked() }

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

// TestChild_GrandchildDiesWithAgent: SIGKILL the agent and the trainer's
// own children go too, not just the trainer (Pdeathsig covers only that
// one): sh -c "sleep & wait; echo" leaves sleep under PID 1 otherwise.
func TestChild_GrandchildDiesWithAgent(t *testing.T) {
	dir := shortDir(t)
	pidFile, gpidFile := filepath.Join(dir, "pid"), filepath.Join(dir, "gpid")
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(os.Environ(), parentHelperEnv+"="+pidFile,
		parentCmdEnv+"=sleep 600 & echo $! > "+gpidFile+".tmp; mv "+gpidFile+".tmp "+gpidFile+"; wait; echo")
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	gpid := readPid(t, gpidFile)
	readPid(t, pidFile) // the guard is in place once the helper wrote this
	agent.Process.Signal(syscall.SIGKILL)
	agent.Wait()
	deadline := time.Now().Add(testWait)
	for !processGone(gpid) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still running after its agent was killed", gpid)
		}
		time.Sleep(10 * time.Millisecond) // polling for the process to go, bounded by deadline
	}
}

// TestChild_CloseKillsLeftovers: once released, what the trainer left in
// its group is killed; before, Stop does not wait for the guard.
func TestChild_CloseKillsLeftovers(t *testing.T) {
	gpidFile := filepath.Join(shortDir(t), "gpid")
	c, _ := startSh(t, "sleep 600 & echo $! > "+gpidFile+".tmp; mv "+gpidFile+".tmp "+gpidFile+"; exit 0")
	gpid := readPid(t, gpidFile)
	if code := waitExit(t, c); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if c.guardOf() == nil {
		t.Fatal("no guard started")
	}
	if processGone(gpid) {
		t.Fatal("the leftover died before Close")
	}
	c.Close()
	deadline := time.Now().Add(testWait)
	for !processGone(gpid) || !processGone(c.guard.PID()) {
		if time.Now().After(deadline) {
			t.Fatalf("leftover %d or guard %d still running after Close", gpid, c.guard.PID())
		}
		time.Sleep(10 * time.Millisecond) // polling for the processes to go, bounded by deadline
	}
}

func readPid(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for {
		if b, err := os.ReadFile(file); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", file)
		}
		time.Sleep(10 * time.Millisecond) // polling for the file, bounded by deadline
	}
}

// TestGuard_RefusesWhereItWouldRecurse: a binary that never calls
// RunGuardIfAsked, or a guard process that did not become one, starts no
// guard. Without this, /proc/self/exe GuardArg in a test binary that
// forgot the init re-ran the whole suite in every guard (a fork bomb).
func TestGuard_RefusesWhereItWouldRecurse(t *testing.T) {
	if err := guardRunnable(); err != nil {
		t.Fatalf("this test binary calls RunGuardIfAsked: %v", err)
	}
	guardWired.Store(false)
	err := guardRunnable()
	guardWired.Store(true)
	if err == nil || !strings.Contains(err.Error(), "RunGuardIfAsked") {
		t.Fatalf("unwired binary: %v", err)
	}
	t.Setenv(guardEnv, "1")
	if _, err := startGuard(os.Getpid(), zap.NewNop()); err == nil || !strings.Contains(err.Error(), "not starting another") {
		t.Fatalf("inside a guard: %v", err)
	}
}

// Alive: a running process is, a zombie (exited, not reaped: a launcher's
// worker until the launcher polls it) and a reaped one are not.
func TestChild_Alive(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "read x")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Alive(pid) {
		t.Fatal("a running process is not Alive")
	}
	in.Close() // it exits; not reaped yet
	deadline := time.Now().Add(10 * time.Second)
	for Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatal("an exited, unreaped process (a zombie) is still Alive after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling /proc, bounded by the deadline
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the zombie is gone already (%v): the test did not see one", err)
	}
	cmd.Wait()
	if Alive(pid) || Alive(0) || Alive(-1) {
		t.Fatal("a reaped process, or pid <= 0, is Alive")
	}
}

// TestChild_StopKillsDescendantsOutsideGroup: a trainer that ignores
// SIGTERM and whose child left its process group (setsid: torch 2.x's
// torchrun starts every rank so) is SIGKILLed after killAfter, and that
// child with it: a kill of the group alone left it running under init.
func TestChild_StopKillsDescendantsOutsideGroup(t *testing.T) {
	gpidFile := filepath.Join(shortDir(t), "gpid")
	c, _ := startSh(t, "trap '' TERM; setsid sleep 600 & echo $! > "+gpidFile+".tmp; mv "+gpidFile+".tmp "+gpidFile+"; wait")
	gpid := readPid(t, gpidFile)
	// $! is setsid(1) before it called setsid(2): wait until it has.
	waitFor(t, "the grandchild to leave the trainer's group", func() bool {
		pgid, err := syscall.Getpgid(gpid)
		return err == nil && pgid != c.PID()
	})
	c.Stop(t.Context(), 100*time.Millisecond)
	waitFor(t, "the grandchild outside the group killed", func() bool { return processGone(gpid) })
	c.Close()
}

// TestChild_KillDuringStop (issue 51): Kill SIGKILLs at once a trainer
// that answers SIGTERM by working on (torchrun unwinding), and its child
// outside the group, while a Stop with a long killAfter waits for it; that
// Stop returns once the child's exit is seen.
func TestChild_KillDuringStop(t *testing.T) {
	gpidFile := filepath.Join(shortDir(t), "gpid")
	c, _ := startSh(t, "trap 'sleep 600' TERM; setsid sleep 600 & echo $! > "+gpidFile+".tmp; mv "+gpidFile+".tmp "+gpidFile+"; wait")
	gpid := readPid(t, gpidFile)
	stopped := make(chan struct{})
	go func() { c.Stop(t.Context(), time.Hour); close(stopped) }()
	c.Kill("test")
	<-c.Done()
	if code := c.ExitCode(); code != 128+int(syscall.SIGKILL) {
		t.Errorf("exit code %d, want %d (SIGKILL)", code, 128+int(syscall.SIGKILL))
	}
	waitFor(t, "the grandchild outside the group killed", func() bool { return processGone(gpid) })
	waitFor(t, "Stop to return", func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	})
	c.Close()
}

// TestGuard_SurvivesTheGroupsSignalsFromItsStart: a trainer that signals
// its own process group from its first instant (a launcher's `kill 0`, or
// the signal fallback's SIGTERM to the group on an early stop) does not
// end the guard: the guard joins the group only once it ignores the
// group's signals. Before, it joined at fork and a SIGTERM in its first
// milliseconds (the Go runtime starting) killed it.
func TestGuard_SurvivesTheGroupsSignalsFromItsStart(t *testing.T) {
	dir := shortDir(t)
	stop, gpidFile := filepath.Join(dir, "stop"), filepath.Join(dir, "gpid")
	c, _ := startSh(t, "trap '' TERM INT HUP; while [ ! -e "+stop+" ]; do kill -TERM 0; kill -INT 0; done; "+
		"sleep 600 & echo $! > "+gpidFile+".tmp; mv "+gpidFile+".tmp "+gpidFile+"; exit 0")
	g := c.guardOf()
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if g == nil {
		t.Fatal("no guard: it did not survive the group's signals during its start")
	}
	if pgid, err := syscall.Getpgid(g.PID()); err != nil || pgid != c.PID() {
		t.Fatalf("guard %d: group %d (%v), want the trainer's %d", g.PID(), pgid, err, c.PID())
	}
	gpid := readPid(t, gpidFile)
	if code := waitExit(t, c); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if processGone(gpid) {
		t.Fatal("the leftover died before Close")
	}
	c.Close()
	waitFor(t, "the leftover and the guard to go with Close", func() bool { return processGone(gpid) && processGone(g.PID()) })
}
