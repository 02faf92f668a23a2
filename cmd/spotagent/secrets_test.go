package main

import (
	"bufio"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
)

// Recognisable fake credentials: none of them may appear in any output.
const (
	secretKeyID  = "AKIASPOTAGENTLEAKTEST"
	secretKey    = "leak/TEST+secret+K3y/never-print-me-0123456789"
	secretToken  = "FwoGZXIvYXdzLEAKTESTsessionTOKENnever-print-me-abcdefghijklmnop"
	secretMarker = "never-print-me"
)

// TestSecurity_NoSecretsInLogs (issue 8): `spotagent run`, in-process,
// against an in-process S3 with AWS credentials in the environment, debug
// logs in JSON, through a commit, a malformed line and an unknown message
// on the socket (the agent's debug lines) and a shutdown checkpoint; then
// list, history and restore. No line of any output holds the credentials.
// The trainer is the pure-Python example. (End to end until #49: the logs
// are the CLI's, the same in-process.)
func TestSecurity_NoSecretsInLogs(t *testing.T) {
	srv, err := s3test.Start("secrets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", secretKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secretKey)
	t.Setenv("AWS_SESSION_TOKEN", secretToken)
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "a.sock")
	const store = "s3://secrets/runs/leak"
	args := []string{"run", "--store", store, "--run-id", "leak", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--cloud", "none", "--interval", "1s", "--log-format", "json", "--log-level", "debug", "--"}
	a := startStoppedAtEnd(t, append(args, exampleTrainer(t, "--steps", "1000000", "--step-time", "0.01")...)...)
	if e := a.entry(t, "store opened"); strings.TrimSuffix(e["uri"].(string), "/") != store {
		t.Fatalf("store opened %v, want %s", e["uri"], store)
	}
	a.entry(t, "checkpoint committed")
	// A malformed line and an unknown type: the agent's debug lines.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("{not json\n{\"type\":\"no-such-type\"}\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(c)
	for range 2 {
		var m map[string]any
		if l, err := r.ReadBytes('\n'); err != nil || json.Unmarshal(l, &m) != nil || m["type"] != "error" {
			t.Fatalf("reply %q %v, want an error", l, err)
		}
	}
	if e := a.entry(t, "malformed line"); e["level"] != "debug" {
		t.Fatalf("malformed line logged at %v, want debug: the run did not log at debug level, so the test proves little", e["level"])
	}
	sigtermSelf(t)
	a.entry(t, "interruption checkpoint committed: stopping the trainer")
	if code := a.wait(t); code != 75 {
		t.Fatalf("exit code %d, want 75:\n%s", code, a.stderr.String())
	}
	outputs := map[string]string{"run": a.stderr.String()}
	for _, args := range [][]string{
		{"list", "--store", store, "--log-level", "debug", "--log-format", "json"},
		{"history", "--store", store, "--log-level", "debug", "--log-format", "json"},
		{"restore", "--store", store, "--dest", filepath.Join(dir, "restored"), "--log-level", "debug", "--log-format", "json"},
	} {
		code, out, errOut := cli(t, args...)
		if code != 0 {
			t.Fatalf("spotagent %s: exit code %d\n%s%s", args[0], code, out, errOut)
		}
		outputs[args[0]] = out + errOut
	}
	for name, out := range outputs {
		for _, s := range []string{secretKeyID, secretKey, secretToken, secretMarker, "LEAKTEST"} {
			if strings.Contains(out, s) {
				t.Errorf("spotagent %s printed the secret %q", name, s)
			}
		}
	}
}
