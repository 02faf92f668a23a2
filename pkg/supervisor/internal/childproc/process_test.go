package childproc

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
)

// exited waits for p's running child to exit and takes its exit.
func exited(t *testing.T, p *Process) Exit {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(testutil.Wait):
		t.Fatal("trainer did not exit")
	}
	return p.Exited()
}

func start(t *testing.T, script string) *Process {
	t.Helper()
	p := New([]string{"sh", "-c", script}, 5*time.Second, 0, nil, zap.NewNop())
	if err := p.Start(os.Environ()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestProcess_NoCommandIsGone(t *testing.T) {
	p := New(nil, time.Second, 0, nil, zap.NewNop())
	if !p.Gone() || p.Running() || p.Started() || p.LastPID() != 0 || p.PID() != 0 {
		t.Fatalf("no command: gone %v running %v started %v pid %d, want gone and nothing else", p.Gone(), p.Running(), p.Started(), p.PID())
	}
}

func TestProcess_ExitedTakesItsCode(t *testing.T) {
	p := start(t, "exit 3")
	if !p.Running() || p.PID() <= 0 || p.Gone() {
		t.Fatalf("started: running %v pid %d gone %v", p.Running(), p.PID(), p.Gone())
	}
	pid := p.PID()
	e := exited(t, p)
	if got, want := e, (Exit{Code: 3}); got != want {
		t.Fatalf("exit %+v, want %+v", got, want)
	}
	if p.Running() || p.PID() != 0 || p.Done() != nil {
		t.Fatalf("after its exit: running %v pid %d (nothing may signal a reused pid)", p.Running(), p.PID())
	}
	if got := p.LastPID(); got != pid {
		t.Fatalf("LastPID %d, want %d", got, pid)
	}
	p.ExitAs(3)
	p.GiveUp()
	if !p.Gone() || p.Finished() || p.ExitCode() != 3 {
		t.Fatalf("gave up after exit 3: gone %v finished %v code %d", p.Gone(), p.Finished(), p.ExitCode())
	}
}

func TestProcess_RestartBackoffThenGiveUp(t *testing.T) {
	p := start(t, "exit 2")
	exited(t, p)
	before := time.Now()
	p.RestartOrGiveUp(2, 1)
	if p.Gone() || p.Restarts() != 1 {
		t.Fatalf("a restart is left: gone %v restarts %d", p.Gone(), p.Restarts())
	}
	at := p.RestartAt()
	if at.Before(before.Add(time.Second)) || p.RestartDue(before) || !p.RestartDue(at) {
		t.Fatalf("restart at %v (asked at %v): want a backoff of a second, due only then", at, before)
	}
	p.Restarting()
	if !p.RestartAt().IsZero() || p.RestartDue(at) {
		t.Fatal("restarting: the pending restart is not cleared")
	}
	if err := p.Start(os.Environ()); err != nil {
		t.Fatal(err)
	}
	exited(t, p)
	p.RestartOrGiveUp(2, 1)
	if !p.Gone() || p.Restarts() != 1 || !p.RestartAt().IsZero() {
		t.Fatalf("no restart left: gone %v restarts %d restart at %v", p.Gone(), p.Restarts(), p.RestartAt())
	}
}

func TestProcess_CancelRestart(t *testing.T) {
	p := start(t, "exit 1")
	exited(t, p)
	p.CancelRestart() // none pending: nothing changes
	if p.Gone() {
		t.Fatal("cancelling no restart made the trainer gone")
	}
	p.RestartOrGiveUp(1, 3)
	p.CancelRestart()
	if !p.Gone() || !p.RestartAt().IsZero() {
		t.Fatalf("cancelled restart: gone %v restart at %v", p.Gone(), p.RestartAt())
	}
}

func TestProcess_StopIsTheAgents(t *testing.T) {
	for _, atDeadline := range []bool{false, true} {
		p := start(t, "exec sleep 60")
		var bg sync.WaitGroup
		goBg := func(fn func()) { bg.Add(1); go func() { defer bg.Done(); fn() }() }
		if atDeadline {
			if !p.StopAtDeadline(context.Background(), goBg) {
				t.Fatal("StopAtDeadline: a running trainer was not stopped")
			}
		} else {
			p.Stop(context.Background(), goBg)
		}
		if !p.Stopping() {
			t.Fatal("Stop: not stopping")
		}
		if p.StopAtDeadline(context.Background(), goBg) {
			t.Fatal("StopAtDeadline while stopping: stopped twice")
		}
		e := exited(t, p)
		bg.Wait()
		if got, want := e, (Exit{Code: 128 + 15, Stopping: true, DeadlineKill: atDeadline}); got != want {
			t.Fatalf("exit %+v, want %+v", got, want)
		}
		if p.Stopping() {
			t.Fatal("after the exit: still stopping")
		}
		p.Stop(context.Background(), goBg) // nothing running: nothing to do
		if p.Stopping() {
			t.Fatal("Stop with nothing running: stopping")
		}
	}
}

func TestProcess_Finished(t *testing.T) {
	p := start(t, "exit 0")
	if p.Finished() {
		t.Fatal("finished while running")
	}
	exited(t, p)
	p.GiveUp()
	if !p.Finished() {
		t.Fatal("exit 0, gone, agent exits 0: not finished")
	}
	p.ExitAs(75) // a stop made it exit 0: interrupted, not finished
	if p.Finished() {
		t.Fatal("agent exits 75: finished")
	}
}
