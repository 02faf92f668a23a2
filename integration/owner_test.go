package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nobody is the uid (and gid) the puppet trainer of the node tests
// (node_allowuid_test.go, rejoin_test.go) runs as. The owner tests that
// used it run in-process: cmd/spotagent otheruid_test.go.
const nobody = 65534

// puppetTrainer is a trainer speaking protocol v1 over a raw socket, driven
// line by line from its stdin (JSON commands), so that a test decides each
// step and waits for its result ("ok <json>" or "err <text>") instead of
// sleeping. Messages a recv skips are kept for a later recv.
const puppetTrainer = `
import json, os, socket, sys
sock = rf = None
kept = []
def out(kind, v):
    sys.stdout.write(kind + " " + json.dumps(v) + "\n")
    sys.stdout.flush()
def match(m, c):
    return m.get("type") in c["types"] and c.get("id") in (None, m.get("id"))
for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    try:
        if op == "connect":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(60)
            sock.connect(c["path"])
            rf = sock.makefile("rb")
            out("ok", None)
        elif op == "send":
            sock.sendall((json.dumps(c["msg"]) + "\n").encode())
            out("ok", None)
        elif op == "recv":
            got = next((m for m in kept if match(m, c)), None)
            if got is not None:
                kept.remove(got)
            while got is None:
                raw = rf.readline()
                if not raw:
                    raise EOFError("agent closed the connection")
                m = json.loads(raw)
                if match(m, c):
                    got = m
                else:
                    kept.append(m)
            out("ok", got)
        elif op == "write":
            os.makedirs(os.path.dirname(c["path"]), exist_ok=True)
            with open(c["path"], "wb") as f:
                f.write(c["data"].encode())
                f.flush()
                os.fsync(f.fileno())
            out("ok", None)
        elif op == "link":
            os.link(c["src"], c["dst"])
            out("ok", None)
        elif op == "rename":
            os.rename(c["src"], c["dst"])
            out("ok", None)
        elif op == "symlink":
            os.symlink(c["src"], c["dst"])
            out("ok", None)
        elif op == "read":
            with open(c["path"], "rb") as f:
                out("ok", f.read().decode(errors="replace"))
        else:
            out("err", "unknown op " + op)
    except (OSError, EOFError) as e:
        out("err", "%s: %s" % (e.__class__.__name__, e))
`

// puppet is a running puppetTrainer.
type puppet struct {
	t     *testing.T
	in    io.Closer
	stdin *json.Encoder
	lines chan string
}

// startPuppet runs puppetTrainer as uid/gid nobody.
func startPuppet(t *testing.T) *puppet {
	t.Helper()
	cmd := exec.Command(python, "-c", puppetTrainer)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &puppet{t: t, in: in, stdin: json.NewEncoder(in), lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("trainer stderr:\n%s", stderr.String())
		}
	})
	return p
}

// close ends the trainer: its stdin closes, it exits.
func (p *puppet) close() {
	p.in.Close()
	for range p.lines {
	}
}

// do runs one command and returns its result: ok, and the JSON value (or
// the error text).
func (p *puppet) do(cmd map[string]any) (bool, json.RawMessage) {
	p.t.Helper()
	if err := p.stdin.Encode(cmd); err != nil {
		p.t.Fatalf("trainer: %v", err)
	}
	select {
	case l, open := <-p.lines:
		if !open {
			p.t.Fatalf("trainer exited during %v", cmd)
		}
		kind, v, _ := strings.Cut(l, " ")
		return kind == "ok", json.RawMessage(v)
	case <-time.After(90 * time.Second):
		p.t.Fatalf("trainer: no answer to %v", cmd)
	}
	return false, nil
}

// must runs cmd and fails the test unless it succeeds.
func (p *puppet) must(cmd map[string]any) json.RawMessage {
	p.t.Helper()
	ok, v := p.do(cmd)
	if !ok {
		p.t.Fatalf("trainer %v: %s", cmd, v)
	}
	return v
}

// recv waits for the agent's next message of one of types (for id, unless
// empty).
func (p *puppet) recv(id string, types ...string) map[string]any {
	p.t.Helper()
	c := map[string]any{"op": "recv", "types": types}
	if id != "" {
		c["id"] = id
	}
	var m map[string]any
	if err := json.Unmarshal(p.must(c), &m); err != nil {
		p.t.Fatal(err)
	}
	return m
}
