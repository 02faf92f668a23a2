package proc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Agent is one running spotagent (or any process that logs JSON lines)
// and its output, copied to a log file and read as it comes.
type Agent struct {
	cmd   *exec.Cmd
	lines <-chan LogLine
	log   *os.File
	Start time.Time // when it was started
}

// StartAgent starts bin with args and env, its output going to logPath.
func StartAgent(bin string, args, env []string, logPath string) (*Agent, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	a := &Agent{cmd: cmd, log: logFile, lines: ReadLines(pr, logFile, 1024), Start: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); pw.Close() }()
	return a, nil
}

// WaitMsg waits for the agent's log line msg for which match (nil: any) holds.
func (a *Agent) WaitMsg(msg string, timeout time.Duration, match func(LogLine) bool) (LogLine, error) {
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				return LogLine{}, fmt.Errorf("agent exited before %q (log %s)", msg, a.log.Name())
			}
			if l.Msg() == msg && (match == nil || match(l)) {
				return l, nil
			}
		case <-deadline:
			return LogLine{}, fmt.Errorf("no %q within %s (log %s)", msg, timeout, a.log.Name())
		}
	}
}

// Kill SIGKILLs the agent (a machine lost) and drains its output.
func (a *Agent) Kill() {
	a.cmd.Process.Signal(syscall.SIGKILL)
	for range a.lines {
	}
	a.log.Close()
}

// WaitEach waits until the agent has logged every message of want (msg →
// match, nil: any), in whichever order, and returns the lines by message.
func (a *Agent) WaitEach(timeout time.Duration, want map[string]func(LogLine) bool) (map[string]LogLine, error) {
	got := map[string]LogLine{}
	deadline := time.After(timeout)
	for len(got) < len(want) {
		select {
		case l, ok := <-a.lines:
			if !ok {
				return got, fmt.Errorf("agent exited before %d of %d messages (log %s)", len(want)-len(got), len(want), a.log.Name())
			}
			if match, ok := want[l.Msg()]; ok && (match == nil || match(l)) {
				if _, seen := got[l.Msg()]; !seen {
					got[l.Msg()] = l
				}
			}
		case <-deadline:
			var miss []string
			for m := range want {
				if _, ok := got[m]; !ok {
					miss = append(miss, m)
				}
			}
			return got, fmt.Errorf("no %q within %s (log %s)", miss, timeout, a.log.Name())
		}
	}
	return got, nil
}

// Until hands the agent's lines, as they come, to f until f returns true
// (nil error) or f fails, the agent exits, or timeout passes.
func (a *Agent) Until(timeout time.Duration, f func(LogLine) (bool, error)) error {
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				return fmt.Errorf("agent exited first (log %s)", a.log.Name())
			}
			done, err := f(l)
			if err != nil {
				return fmt.Errorf("%w (log %s)", err, a.log.Name())
			}
			if done {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("not within %s (log %s)", timeout, a.log.Name())
		}
	}
}
