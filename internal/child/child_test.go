package child

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startSh runs script under /bin/sh -c; its stdout lines arrive on the
// returned channel.
func startSh(t *testing.T, script string, env ...string) (*Child, <-chan string) {
	t.Helper()
	pr, pw := io.Pipe()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	c, err := Start(Config{Args: []string{"/bin/sh", "-c", script}, Env: env, Stdout: pw})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		c.Signal(syscall.SIGKILL)
		<-c.Done()
		c.Close()
		pw.Close()
	})
	return c, lines
}

func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("child stdout closed")
		}
		return l
	case <-time.After(testWait):
		t.Fatal("no line from child")
	}
	return ""
}

func waitExit(t *testing.T, c *Child) int {
	t.Helper()
	select {
	case <-c.Done():
		return c.ExitCode()
	case <-time.After(testWait):
		t.Fatal("child did not exit")
	}
	return 0
}

// processGone reports whether pid no longer runs (absent, or a zombie).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	return strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
}

func TestChild_ExitCode(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 7", 7},
		{"kill -KILL $$", 128 + 9},
		{"kill -TERM $$", 128 + 15},
	} {
		c, _ := startSh(t, tc.script)
		if got := waitExit(t, c); got != tc.want {
			t.Errorf("%q: ExitCode=%d, want %d", tc.script, got, tc.want)
		}
	}
}

func TestChild_EnvDirOutput(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	c, err := Start(Config{
		Args:   []string{"/bin/sh", "-c", `printf '%s|%s|%s' "$SPOTAGENT_RUN_ID" "$PWD" "$HOME"; echo oops >&2`},
		Env:    []string{"SPOTAGENT_RUN_ID=old", "SPOTAGENT_RUN_ID=run42"},
		Dir:    dir,
		Stdout: &out,
		Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, c); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Env is added to the agent's own environment (HOME is inherited).
	if got, want := out.String(), "run42|"+dir+"|"+os.Getenv("HOME"); got != want {
		t.Errorf("stdout=%q, want %q", got, want)
	}
	if got := errb.String(); got != "oops\n" {
		t.Errorf("stderr=%q, want oops", got)
	}
}

func TestChild_OwnProcessGroup(t *testing.T) {
	c, lines := startSh(t, `echo ready; exec sleep 1000`)
	nextLine(t, lines)
	pgid, err := syscall.Getpgid(c.PID())
	if err != nil {
		t.Fatal(err)
	}
	if pgid != c.PID() || pgid == syscall.Getpgrp() {
		t.Errorf("child pgid=%d, want its own pid %d (agent's group %d)", pgid, c.PID(), syscall.Getpgrp())
	}
}

func TestChild_Signal(t *testing.T) {
	c, lines := startSh(t, `trap 'exit 42' USR1; echo ready; while :; do sleep 0.01; done`)
	nextLine(t, lines)
	if err := c.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if got := waitExit(t, c); got != 42 {
		t.Errorf("ExitCode=%d, want 42", got)
	}
}

func TestChild_StopTermsGroup(t *testing.T) {
	c, lines := startSh(t, `sleep 1000 & echo $!; wait`)
	grandchild, err := strconv.Atoi(nextLine(t, lines))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Stop(t.Context(), time.Minute)
	if d := time.Since(start); d > testWait {
		t.Errorf("Stop took %v; SIGTERM should have been enough", d)
	}
	if got := waitExit(t, c); got != 128+15 {
		t.Errorf("ExitCode=%d, want %d (SIGTERM)", got, 128+15)
	}
	waitFor(t, "grandchild gone", func() bool { return processGone(grandchild) })
}

func TestChild_StopKillsAfter(t *testing.T) {
	const killAfter = 300 * time.Millisecond
	c, lines := startSh(t, `trap '' TERM; echo ready; while :; do sleep 1; done`)
	nextLine(t, lines)
	start := time.Now()
	c.Stop(t.Context(), killAfter)
	if d := time.Since(start); d < killAfter {
		t.Errorf("Stop returned after %v, before killAfter %v", d, killAfter)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Stop returned before the child exited")
	}
	if got := c.ExitCode(); got != 128+9 {
		t.Errorf("ExitCode=%d, want %d (SIGKILL)", got, 128+9)
	}
}

// A worker that ignores SIGTERM outlives the child: Stop kills the group.
func TestChild_StopKillsLingeringGroup(t *testing.T) {
	const killAfter = 300 * time.Millisecond
	c, lines := startSh(t, `sh -c 'trap "" TERM; echo $$; while :; do sleep 1; done' & wait`)
	worker, err := strconv.Atoi(nextLine(t, lines))
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(t.Context(), killAfter)
	if got := waitExit(t, c); got != 128+15 {
		t.Errorf("ExitCode=%d, want %d: the child itself obeys SIGTERM", got, 128+15)
	}
	waitFor(t, "worker gone", func() bool { return processGone(worker) })
}

func TestChild_StopHonoursContext(t *testing.T) {
	c, lines := startSh(t, `trap '' TERM; echo ready; while :; do sleep 1; done`)
	nextLine(t, lines)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c.Stop(ctx, time.Hour)
	select {
	case <-c.Done():
		t.Error("child exited, but it ignores SIGTERM and killAfter is an hour")
	default:
	}
}

func TestChild_StartErrors(t *testing.T) {
	if _, err := Start(Config{}); err == nil {
		t.Error("Start with no args succeeded")
	}
	_, err := Start(Config{Args: []string{"/nonexistent/trainer"}})
	if err == nil {
		t.Fatal("Start of a missing command succeeded")
	}
	if got := ExitCodeFromError(err); got != 127 {
		t.Errorf("ExitCodeFromError(%v)=%d, want 127", err, got)
	}
	if got := ExitCodeFromError(nil); got != 0 {
		t.Errorf("ExitCodeFromError(nil)=%d, want 0", got)
	}
}

// parentHelperEnv makes the test binary act as an agent that starts a
// trainer, writes the trainer's pid to the named file and waits forever.
const parentHelperEnv = "SPOTAGENT_TEST_PARENT"

// parentCmdEnv, when set, is the helper's trainer script instead of sleep.
const parentCmdEnv = "SPOTAGENT_TEST_PARENT_CMD"

func parentHelper(pidFile string) int {
	script := "exec sleep 300"
	if s := os.Getenv(parentCmdEnv); s != "" {
		script = s
	}
	c, err := Start(Config{Args: []string{"/bin/sh", "-c", script}})
	if err != nil {
		return 1
	}
	os.WriteFile(pidFile+".tmp", []byte(strconv.Itoa(c.PID())), 0o600)
	os.Rename(pidFile+".tmp", pidFile)
	<-c.Done()
	return 0
}
