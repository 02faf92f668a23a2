package child

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// childAttr puts the trainer in its own process group, and has the kernel
// kill it if the agent dies (kill -9, OOM): a trainer left behind would keep
// a GPU busy and reconnect to the next agent beside the trainer that agent
// starts. Pdeathsig follows the thread that started the child; the agent
// never locks goroutines to threads, so Go does not retire that thread.
// Pdeathsig reaches the trainer alone: its own children (sh -c "python
// ...", torchrun's workers, dataloaders) are left to the guard.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// GuardArg is the only argument of a guard process: the agent's own
// executable started again (/proc/self/exe) to watch over a trainer's
// process group.
const GuardArg = "__spotagent_guard"

// guardStartTimeout bounds how long Start waits for a guard to say it
// is ready; past it the trainer runs without one.
const guardStartTimeout = 5 * time.Second

// guardEnv marks a guard process's environment. A process that has it
// and is about to start a guard is a binary that did not become the guard
// (it never called RunGuardIfAsked) and is running its main again: it
// must not start yet another one.
const guardEnv = "SPOTAGENT_GUARD_PROCESS"

// guardWired is set by RunGuardIfAsked: this binary turns into a guard
// when started as one. Without it, /proc/self/exe GuardArg would run the
// binary's main (a test binary: the whole suite, whose trainers start
// more guards) instead.
var guardWired atomic.Bool

// RunGuardIfAsked turns this process into a guard, and never returns, when
// it was started as one. Call it first thing in main (and in a test
// binary's init, for the tests that start trainers): a binary that does
// not call it starts its trainers without a guard, with a warning.
func RunGuardIfAsked() {
	guardWired.Store(true)
	if len(os.Args) == 2 && os.Args[1] == GuardArg {
		os.Exit(runGuard())
	}
}

// guardRunnable says why this process must not start a guard, or nil.
func guardRunnable() error {
	switch {
	case os.Getenv(guardEnv) != "":
		return errors.New("this process was started as a guard but did not become one (RunGuardIfAsked not called): not starting another")
	case !guardWired.Load():
		return errors.New("this binary never calls child.RunGuardIfAsked (call it in main, or in a test binary's init), so it cannot be its own guard")
	}
	return nil
}

// runGuard sits in the trainer's process group, ignoring the signals the
// agent sends that group, and holds the read end of a pipe whose write end
// only the agent has. When the pipe reaches EOF -- the agent released the
// trainer, or died in any way, SIGKILL included, since the kernel closes a
// dead process's files -- it SIGKILLs the whole group, itself included:
// every grandchild that stayed in the group goes with the agent, and so do
// the members' descendants that left it (setsid), killed just before.
//
// It starts in a process group of its own and joins the trainer's only
// once it ignores the group's signals: a trainer that signals its group
// from its first instant (a launcher's `kill 0`, the signal fallback's
// SIGTERM on an early stop) would otherwise end it while the Go runtime
// starts. It says ready (one byte 1) once in the group, or why not.
func runGuard() int {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	ready := os.NewFile(4, "ready")
	pgid, err := strconv.Atoi(os.Getenv(guardEnv))
	if err == nil {
		err = syscall.Setpgid(0, pgid)
	}
	if err != nil {
		ready.Write([]byte("join the trainer's process group: " + err.Error()))
		return 1
	}
	ready.Write([]byte{1})
	ready.Close()
	// The members' descendants that left the group (torch 2.x's ranks, in
	// sessions of their own: child.go) can be found only while their
	// parents live, and an agent's death kills the trainer too
	// (Pdeathsig): they are looked for every outsiderScan meanwhile, and
	// killed (those still the same process) with a last look first.
	pgid, self := syscall.Getpgrp(), os.Getpid()
	var mu sync.Mutex
	seen := map[int]uint64{}
	go func() {
		for {
			found := outsiders(pgid, self)
			mu.Lock()
			maps.Copy(seen, found)
			mu.Unlock()
			time.Sleep(outsiderScan) // a period, not a synchronisation
		}
	}()
	io.Copy(io.Discard, os.NewFile(3, "lifeline"))
	mu.Lock()
	maps.Copy(seen, outsiders(pgid, self))
	killAll(seen)
	syscall.Kill(0, syscall.SIGKILL)
	return 1 // not reached
}

// outsiderScan is how often a guard looks for the trainer's descendants
// outside its group: one started and orphaned within it is missed.
const outsiderScan = time.Second

// guard is the agent's side of one guard process.
type guard struct {
	pid      int
	lifeline *os.File // write end: closing it makes the guard kill the group
	reaped   chan struct{}
	once     sync.Once
}

// startGuard starts a guard in process group pgid and waits until it
// ignores the group's signals. It returns nil (the trainer then runs
// without one) when the guard cannot start.
func startGuard(pgid int, log *zap.Logger) (*guard, error) {
	if err := guardRunnable(); err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, fmt.Errorf("guard: %w", err)
	}
	defer readyR.Close()
	cmd := exec.Command("/proc/self/exe", GuardArg)
	cmd.ExtraFiles = []*os.File{lifeR, readyW} // fds 3 and 4
	cmd.Env = append(os.Environ(), guardEnv+"="+strconv.Itoa(pgid))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own until it ignores signals: runGuard
	err = cmd.Start()
	lifeR.Close()
	readyW.Close()
	if err != nil {
		lifeW.Close()
		return nil, fmt.Errorf("guard: %w", err)
	}
	reaped := make(chan struct{})
	go func() { cmd.Wait(); close(reaped) }() // release waits for it
	readyR.SetReadDeadline(time.Now().Add(guardStartTimeout))
	said := make([]byte, 256)
	n, err := readyR.Read(said)
	if err == nil && (n != 1 || said[0] != 1) {
		err = errors.New(string(said[:n]))
	}
	if err != nil {
		cmd.Process.Kill()
		lifeW.Close()
		if errors.Is(err, io.EOF) {
			err = errors.New("exited before it was ready")
		}
		return nil, fmt.Errorf("guard: %w", err)
	}
	log.Debug("trainer guard started", zap.Int("guard_pid", cmd.Process.Pid), zap.Int("pgid", pgid))
	return &guard{pid: cmd.Process.Pid, lifeline: lifeW, reaped: reaped}, nil
}

// release makes the guard SIGKILL what is left of the group, and exit,
// and waits (bounded) until it is reaped: nothing the agent started is
// left behind it.
func (g *guard) release() {
	if g == nil {
		return
	}
	g.once.Do(func() { g.lifeline.Close() })
	select {
	case <-g.reaped:
	case <-time.After(5 * time.Second): // it SIGKILLs itself with the group: never seen
	}
}

func (g *guard) PID() int {
	if g == nil {
		return 0
	}
	return g.pid
}
