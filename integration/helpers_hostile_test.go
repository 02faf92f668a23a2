package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// fakeTrainer is the command line (after "--") of the tests' one fake
// trainer, python/tests/faketrainer.py: a real trainer on the Python
// client over the real socket, its behaviours chosen by flags (see its
// doc). Every line it prints starts with "trainer: ".
func fakeTrainer(flags ...string) []string {
	return append([]string{python, filepath.Join(repo, "python", "tests", "faketrainer.py")}, flags...)
}

// hostileModes are the fake trainer's flags for the hostile tests' modes.
// The first checkpoint request is always answered properly, so that every
// test has a previous checkpoint that must stand; the mode decides the rest:
//
//	good      answer every request (1 KiB file, or BIG_BYTES when given)
//	never     answer nothing after the first, ignore stop (killed at the deadline)
var hostileModes = map[string][]string{
	"good":  nil,
	"never": {"--on", "1=write,done", "--on", "ignore", "--ignore-stop"},
}

// writeTrainer returns the command line (after "--") of the fake trainer
// in a hostile MODE, big (when > 0) the bytes it writes. dir is unused
// (the trainer is a file of the repository).
func writeTrainer(t *testing.T, dir, mode string, big int) []string {
	t.Helper()
	flags, ok := hostileModes[mode]
	if !ok {
		t.Fatalf("no hostile trainer mode %q", mode)
	}
	var args []string
	for _, f := range flags {
		args = append(args, strings.ReplaceAll(f, "BIG", strconv.Itoa(big)))
	}
	if big > 0 && mode == "good" {
		args = append(args, "--file", "state.bin:"+strconv.Itoa(big))
	}
	return append([]string{"--"}, fakeTrainer(args...)...)
}

// hostileArgs are the agent flags of these tests: a 1 s periodic interval,
// JSON logs (so that fields can be asserted), a file store under dir.
func hostileArgs(dir string, extra ...string) []string {
	args := []string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "hostile",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--cloud", "none", "--interval", "1s", "--log-format", "json", "--log-level", "info"}
	return append(args, extra...)
}

// logEntry is one JSON log line of the agent.
type logEntry map[string]any

func (e logEntry) str(k string) string {
	s, _ := e[k].(string)
	return s
}

func (e logEntry) num(k string) int64 {
	f, _ := e[k].(float64)
	return int64(f)
}

// entries returns the agent's JSON log lines with message msg, in order.
func (p *proc) entries(msg string) []logEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []logEntry
	for _, l := range p.lines {
		if !strings.HasPrefix(l, "{") || !strings.Contains(l, `"msg":"`+msg+`"`) {
			continue
		}
		var e logEntry
		if json.Unmarshal([]byte(l), &e) == nil && e.str("msg") == msg {
			out = append(out, e)
		}
	}
	return out
}

// waitUntil polls found until it holds (testutil.WaitWithin), failing
// the test after timeout, or at once when the agent has exited without it
// holding: one last look then, as done closes once every line is in
// (startCmd). The package's waits on an agent's output go through it.
func (p *proc) waitUntil(what string, timeout time.Duration, found func() bool) {
	p.t.Helper()
	exited := false
	testutil.WaitWithin(p.t, what, timeout, func() bool {
		select {
		case <-p.done:
			exited = true
		default:
		}
		return found() || exited
	})
	if exited && !found() {
		p.t.Fatalf("spotagent exited without %s", what)
	}
}

// waitEntry waits for the agent's log line with message msg for which
// match (nil: any) holds, and returns it.
func (p *proc) waitEntry(msg string, timeout time.Duration, match func(logEntry) bool) logEntry {
	p.t.Helper()
	var got logEntry
	p.waitUntil(fmt.Sprintf("a %q log line", msg), timeout, func() bool {
		for _, e := range p.entries(msg) {
			if match == nil || match(e) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// waitCount waits until the agent logged msg at least n times.
func (p *proc) waitCount(msg string, n int, timeout time.Duration) []logEntry {
	p.t.Helper()
	var es []logEntry
	p.waitUntil(fmt.Sprintf("%d %q log lines", n, msg), timeout, func() bool {
		es = p.entries(msg)
		return len(es) >= n
	})
	return es
}

// has reports whether any output line matches re.
func (p *proc) has(re string) bool {
	rx := regexp.MustCompile(re)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if rx.MatchString(l) {
			return true
		}
	}
	return false
}
