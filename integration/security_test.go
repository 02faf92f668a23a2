package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
)

// Security (issue 8): nothing secret in the logs, and the socket as the
// trust boundary on a real run.

// Recognisable fake credentials: none of them may appear in any output.
const (
	secretKeyID  = "AKIASPOTAGENTLEAKTEST"
	secretKey    = "leak/TEST+secret+K3y/never-print-me-0123456789"
	secretToken  = "FwoGZXIvYXdzLEAKTESTsessionTOKENnever-print-me-abcdefghijklmnop"
	secretMarker = "never-print-me"
)

// TestSecurity_NoSecretsInLogs runs the agent against an in-process S3
// with AWS credentials in the environment, debug logs in JSON, through a
// commit, a shutdown checkpoint, list, history and restore, and greps every
// line of output for the credentials.
func TestSecurity_NoSecretsInLogs(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	s3, err := s3test.Start("secrets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3.Close)
	env := append(s3.Env(),
		"AWS_ACCESS_KEY_ID="+secretKeyID,
		"AWS_SECRET_ACCESS_KEY="+secretKey,
		"AWS_SESSION_TOKEN="+secretToken,
	)
	dir := testutil.ShortDir(t)
	store := "s3://secrets/runs/leak"
	args := hostileArgs(dir, "--store", store, "--log-level", "debug")
	p := start(t, env, append(args, writeTrainer(t, dir, "good", 0)...)...)
	p.waitEntry("store opened", time.Minute, func(e logEntry) bool { return strings.TrimSuffix(e.str("uri"), "/") == store })
	p.waitEntry("checkpoint committed", time.Minute, nil)
	// A malformed line and an unknown type: the agent's debug lines.
	c := dialRaw(t, filepath.Join(dir, "a.sock"))
	if _, err := c.c.Write([]byte("{not json\n")); err != nil {
		t.Fatal(err)
	}
	c.send(map[string]any{"type": "no-such-type"})
	for i := 0; i < 2; i++ {
		if m, err := c.recv(10 * time.Second); err != nil || m["type"] != "error" {
			t.Fatalf("reply %v %v, want an error", m, err)
		}
	}
	p.waitEntry("malformed line", 10*time.Second, func(e logEntry) bool { return e.str("level") == "debug" })
	p.signal(syscall.SIGTERM)
	p.waitEntry("interruption checkpoint committed: stopping the trainer", time.Minute, nil)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	if !p.has(`"level":"debug"`) {
		t.Fatal("no debug line: the run did not log at debug level, so the test proves little")
	}
	outputs := map[string]*proc{"run": p}
	for _, cmd := range [][]string{
		{"list", "--store", store, "--log-level", "debug", "--log-format", "json"},
		{"history", "--store", store, "--log-level", "debug", "--log-format", "json"},
		{"restore", "--store", store, "--dest", filepath.Join(dir, "restored"), "--log-level", "debug", "--log-format", "json"},
	} {
		c := start(t, env, cmd...)
		if code := c.wait(time.Minute); code != 0 {
			t.Fatalf("spotagent %s: exit code %d\n%s", cmd[0], code, c.output())
		}
		outputs[cmd[0]] = c
	}
	for name, c := range outputs {
		out := c.output()
		for _, s := range []string{secretKeyID, secretKey, secretToken, secretMarker, "LEAKTEST"} {
			if strings.Contains(out, s) {
				t.Errorf("spotagent %s printed the secret %q", name, s)
			}
		}
	}
}

// TestSecurity_SocketPermissions: on a real run with the default socket
// path, the socket directory is created 0700 and the socket is 0600, and
// a process running as nobody cannot even connect.
func TestSecurity_SocketPermissions(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// No --socket: the default, $TMPDIR/spotagent-UID/RUN-ID.sock.
	args := []string{"run", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "perm",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--cloud", "none", "--interval", "1s", "--log-format", "json"}
	p := start(t, []string{"TMPDIR=" + tmp}, append(args, writeTrainer(t, dir, "good", 0)...)...)
	l := p.waitEntry("socket listening", time.Minute, nil)
	sock := l.str("path")
	if want := filepath.Join(tmp, "spotagent-"+strconv.Itoa(os.Getuid()), "perm.sock"); sock != want {
		t.Fatalf("socket at %s, want the default %s", sock, want)
	}
	p.waitEntry("checkpoint committed", time.Minute, nil)
	for _, c := range []struct {
		path string
		want os.FileMode
	}{{filepath.Dir(sock), os.ModeDir | 0o700}, {sock, os.ModeSocket | 0o600}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModeType | os.ModePerm); got != c.want {
			t.Fatalf("%s: mode %s, want %s", c.path, got, c.want)
		}
	}
	if out := asNobody(t, nobodyConnect, sock); !strings.HasPrefix(out, "connect: PermissionError") {
		t.Fatalf("nobody's connect: %q, want PermissionError", out)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("exit code %d, want %d", code, exitInterrupted)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after exit: %v", err)
	}
}
