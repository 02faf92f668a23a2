package proc

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgent: a process that logs JSON lines, read as they come: the lines
// waited for are found whatever the order, a plain line is kept as text,
// the log file holds every line, and an exit ends the wait with an error.
func TestAgent(t *testing.T) {
	dir := t.TempDir()
	script := `echo '{"msg":"starting","n":1}'; echo 'not json'; echo '{"msg":"ready","n":2}'; echo '{"msg":"restored","step":7}'`
	a, err := StartAgent("/bin/sh", []string{"-c", script}, nil, filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.WaitMsg("ready", 30*time.Second, func(l LogLine) bool { return l.Raw["n"] == 2.0 })
	if err != nil || l.At.Before(a.Start) {
		t.Fatalf("WaitMsg: %+v, %v", l, err)
	}
	if _, err := a.WaitEach(30*time.Second, map[string]func(LogLine) bool{"restored": nil}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WaitMsg("never", 30*time.Second, nil); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("waiting past the exit: %v, want an error saying it exited", err)
	}
	a.Kill()
	b, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
	if !strings.Contains(string(b), "not json") || strings.Count(string(b), "\n") != 4 {
		t.Fatalf("log file:\n%s", b)
	}
}

func TestReadLines(t *testing.T) {
	var log bytes.Buffer
	var got []LogLine
	for l := range ReadLines(strings.NewReader("{\"msg\":\"a\"}\nplain\n"), &log, 4) {
		got = append(got, l)
	}
	if len(got) != 2 || got[0].Msg() != "a" || got[1].Raw != nil || got[1].Text != "plain" || got[1].Msg() != "" {
		t.Fatalf("lines %+v", got)
	}
}

// TestSelf: this process's /proc figures, a staged copy of a binary and
// a timed run.
func TestSelf(t *testing.T) {
	if VMKiB(os.Getpid(), "VmRSS") <= 0 || VMKiB(os.Getpid(), "NoSuchField") != 0 {
		t.Error("VMKiB")
	}
	if _, err := CPUTicks(os.Getpid()); err != nil {
		t.Error(err)
	}
	dst, err := StageBinary(filepath.Join(t.TempDir(), "bin"), "/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if d, _, _, err := Run([]string{"X=y"}, &out, dst, "-c", "echo $X"); err != nil || d <= 0 || out.String() != "y\n" {
		t.Fatalf("Run the staged copy: %q, %v", out.String(), err)
	}
	if _, _, _, err := Run(nil, &out, dst, "-c", "echo oops >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Fatalf("a failed run: %v, want its stderr in the error", err)
	}
	if Tail("abcdef", 3) != "def" || Tail("ab", 3) != "ab" {
		t.Error("Tail")
	}
}
