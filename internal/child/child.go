// Package child runs the trainer as a child process: its own process group,
// the guard that takes the group down with the agent, Stop (SIGTERM, then
// SIGKILL), and the exit codes a shell would give.
package child

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Config configures Start.
type Config struct {
	Args   []string  // command and arguments; Args[0] is looked up in PATH
	Env    []string  // added to the agent's environment; later entries win
	Dir    string    // working directory; empty: the agent's
	Stdout io.Writer // default os.Stdout
	Stderr io.Writer // default os.Stderr
	Log    *zap.Logger
}

// ioDrainDelay bounds how long Done waits, after the child exits, for
// output still held open by a grandchild when Stdout/Stderr are not files.
const ioDrainDelay = 2 * time.Second

// groupPoll is how often Stop checks whether the child's process group
// still has members after the child itself exited.
const groupPoll = 20 * time.Millisecond

// Child is a trainer process running in its own process group, so that
// signals reach its workers too and a terminal's Ctrl-C reaches only the
// agent, which then runs its shutdown sequence.
//
// On Linux a guard process (see runGuard) joins the group: when the agent
// dies, even by SIGKILL, the guard kills the whole group, so that no
// grandchild (sh -c "python ...", a launcher's workers) outlives the agent
// under PID 1. Pdeathsig alone would take only the trainer itself.
type Child struct {
	cmd  *exec.Cmd
	pid  int
	log  *zap.Logger
	done chan struct{}
	code int
	// guard is set once guarded is closed (nil: none, not Linux, or it
	// could not start); read it through guarded().
	guard   *guard
	guarded chan struct{}
}

// guardOf is the trainer's guard once its start ended (nil: none). The
// agent's signals to the group wait for it: Kill and Stop look for the
// group's descendants outside it, excepting the guard's pid. (The guard
// cannot die of the group's signals: it joins the group once it ignores
// them, runGuard.)
func (c *Child) guardOf() *guard {
	<-c.guarded
	return c.guard
}

// Start starts the command in a new process group. Stdin is /dev/null.
func Start(cfg Config) (*Child, error) {
	if len(cfg.Args) == 0 {
		return nil, errors.New("start child: empty command")
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	cmd := exec.Command(cfg.Args[0], cfg.Args[1:]...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.Dir = cfg.Dir
	cmd.Stdout = cfg.Stdout
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	cmd.Stderr = cfg.Stderr
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = ioDrainDelay
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	c := &Child{cmd: cmd, pid: cmd.Process.Pid, log: log.With(zap.Int("child_pid", cmd.Process.Pid)), done: make(chan struct{}), guarded: make(chan struct{})}
	// Debug: the supervisor logs the event (its "trainer started"), one
	// message per event.
	c.log.Debug("child started", zap.Strings("args", cfg.Args))
	go c.wait()
	// The trainer runs already: a grandchild it forks before the guard
	// joins (the guard takes milliseconds, an interpreter longer to start)
	// is the only one not covered. The guard starts beside the caller,
	// which goes on at once (the agent's loop welcomes the trainer's hello
	// meanwhile: a guard, a Go binary, can take longer than an interpreter
	// to connect on a busy machine); Signal, Stop, Kill and Close wait
	// for it (guardOf).
	go func() {
		g, err := startGuard(c.pid, c.log)
		select {
		case <-c.done:
			err = nil // gone already, and its group with it unless a grandchild holds it
		default:
		}
		if err != nil {
			c.log.Warn("trainer guard not started: the trainer's own children may outlive a killed agent", zap.Error(err))
		}
		c.guard = g
		close(c.guarded)
	}()
	return c, nil
}

// Close releases the child's process group: on Linux the guard SIGKILLs
// whatever is still running in it. Call it once the child is of no further
// use (it exited and the agent ends, or restarts it). Idempotent.
func (c *Child) Close() { c.guardOf().release() }

func (c *Child) wait() {
	err := c.cmd.Wait()
	c.code = exitCode(c.cmd.ProcessState, err)
	// Debug: the agent logs the event itself ("trainer exited"), one line.
	c.log.Debug("child exited", zap.Int("exit_code", c.code), zap.Stringer("state", c.cmd.ProcessState))
	close(c.done)
}

// PID is the child's pid, which is also its process group id.
func (c *Child) PID() int { return c.pid }

// Done is closed once the child has exited and been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// ExitCode is valid after Done: the exit status, or 128+N if signal N
// killed the child.
func (c *Child) ExitCode() int {
	<-c.done
	return c.code
}

// Signal sends sig to the child's whole process group.
func (c *Child) Signal(sig syscall.Signal) error {
	c.guardOf() // not before the guard ignores the group's signals
	if err := syscall.Kill(-c.pid, sig); err != nil {
		return fmt.Errorf("signal child group: %w", err)
	}
	return nil
}

// Stop sends SIGTERM to the process group and, if the child or anything
// else in its group is still running after killAfter, SIGKILL to the group.
// It returns once the child has exited (the group SIGKILLed if needed), or
// when ctx ends.
func (c *Child) Stop(ctx context.Context, killAfter time.Duration) {
	if c.Signal(syscall.SIGTERM) != nil {
		// ESRCH: the whole group is gone already.
		c.waitDone(ctx)
		return
	}
	c.log.Info("child group sent SIGTERM", zap.Duration("kill_after", killAfter))
	kill := time.NewTimer(killAfter)
	defer kill.Stop()
	select {
	case <-c.done:
	case <-kill.C:
		c.killGroup("child still running")
		c.waitDone(ctx)
		return
	case <-ctx.Done():
		return
	}
	// The child is gone; workers it left in the group get the same grace.
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for c.groupAlive() {
		select {
		case <-tick.C:
		case <-kill.C:
			c.killGroup("child exited, group still running")
			return
		case <-ctx.Done():
			return
		}
	}
}

// Kill SIGKILLs the process group at once, and the processes its members
// started outside it (torch 2.x's ranks, each in a session of its own),
// found before the group dies; why goes to the log. A Stop under way
// returns once the child's exit is seen.
func (c *Child) Kill(why string) { c.killGroup(why) }

func (c *Child) killGroup(why string) {
	// Found before the group dies: its members' children in sessions of
	// their own are re-parented to init with it, and lost to the search.
	out := outsiders(c.pid, c.guardOf().PID())
	killAll(out)
	if err := c.Signal(syscall.SIGKILL); err == nil {
		c.log.Warn(why+": group sent SIGKILL", zap.Int("pgid", c.pid), zap.Int("outside_group", len(out)))
	}
}

// proc is one process as /proc/PID/stat shows it.
type proc struct {
	ppid, pgrp int
	zombie     bool
	start      uint64 // clock ticks after boot: with the pid, names one process
}

// procs reads every process's parent and group from /proc (empty where
// there is none).
func procs() map[int]proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make(map[int]proc, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		var start uint64
		if len(f) > 19 {
			start, _ = strconv.ParseUint(f[19], 10, 64)
		}
		out[pid] = proc{ppid: ppid, pgrp: pgrp, zombie: f[0] == "Z", start: start}
	}
	return out
}

// Tree is pid and every process below it, parents before their children,
// from one read of /proc (just pid without /proc). Tests and benchmarks
// use it to stop or kill a simulated node's whole tree, torch 2.x's ranks
// in sessions of their own included.
func Tree(pid int) []int {
	children := map[int][]int{}
	for p, pr := range procs() {
		children[pr.ppid] = append(children[pr.ppid], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		kids := children[out[i]]
		slices.Sort(kids) // in the order they started, near enough: pids grow
		out = append(out, kids...)
	}
	return out
}

// outsiders are the live descendants of process group pgid's members that
// left the group (setsid, setpgid), except the pid except (the guard):
// torch 2.x's torchrun starts each rank in a session of its own, so a
// SIGKILL of the launcher's group alone leaves the ranks training,
// orphaned, on the GPUs the next trainer needs. Empty without /proc.
func outsiders(pgid, except int) map[int]uint64 {
	all := procs()
	in := map[int]bool{}
	for pid, p := range all {
		if p.pgrp == pgid && pid != except {
			in[pid] = true
		}
	}
	out := map[int]uint64{}
	for grew := true; grew; {
		grew = false
		for pid, p := range all {
			if !in[pid] && in[p.ppid] && pid != except {
				in[pid], grew = true, true
				if p.pgrp != pgid && !p.zombie {
					out[pid] = p.start
				}
			}
		}
	}
	return out
}

// killAll SIGKILLs each process (pid → start time: a pid reused by
// another process since is left alone), and the group of each that leads
// one.
func killAll(pids map[int]uint64) {
	now := procs()
	for pid, start := range pids {
		if p, ok := now[pid]; !ok || p.start != start {
			continue
		}
		if p := now[pid]; p.pgrp == pid {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func (c *Child) waitDone(ctx context.Context) {
	select {
	case <-c.done:
	case <-ctx.Done():
	}
}

// groupAlive reports whether the process group still has a running member.
// kill(-pgid, 0) also counts zombies, which linger when the init process
// reaps slowly (common in containers), so where /proc exists a group of
// zombies only is reported as gone.
func (c *Child) groupAlive() bool {
	if syscall.Kill(-c.pid, 0) != nil {
		return false
	}
	live, ok := groupHasLiveMember(c.pid, c.guardOf().PID())
	return live || !ok
}

// groupHasLiveMember scans /proc for a non-zombie process in group pgid
// other than pid except (the guard); ok is false when /proc cannot be read.
func groupHasLiveMember(pgid, except int) (live, ok bool) {
	all := procs()
	if all == nil {
		return false, false
	}
	for pid, p := range all {
		if pid != except && p.pgrp == pgid && !p.zombie {
			return true, true
		}
	}
	return false, true
}

// Alive reports whether process pid runs: it exists and, where /proc can
// be read, is not a zombie (a launcher's worker that exited stays one until
// the launcher reaps it: torchrun does at its next monitor tick, up to 5 s).
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) < 1 || f[0] != "Z"
}

// ExitCodeFromError maps an error from Start or exec to a shell-style
// exit code: 0 for nil, the status (or 128+N for signal N) for an exit
// error, 127 for a command not found, 126 for one not executable, else 1.
func ExitCodeFromError(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return exitCode(ee.ProcessState, err)
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return 127
	case errors.Is(err, fs.ErrPermission):
		return 126
	default:
		return 1
	}
}

func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		if err == nil {
			return 0
		}
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
