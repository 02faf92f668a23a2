package integration

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
)

// Security (issue 8): nothing secret in the logs. The socket as the trust
// boundary: cmd/spotagent TestRun_Socket (the default path and modes, the
// flags) and pkg/protocol TestServer_RefusesOtherUID (another uid, a real
// process), in-process since #49.

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
