package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// runCLI runs spotagent to completion and returns its exit code, stdout
// and stderr apart (help goes to stdout, errors to stderr).
func runCLI(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(agentBin(t), args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("spotagent %s: %v", strings.Join(args, " "), err)
	}
	return code, out.String(), errb.String()
}

// cliCommands is every subcommand `spotagent help` must list.
var cliCommands = []string{"run", "sidecar", "node", "status", "list", "restore", "history", "watch",
	"simulate", "fake-metadata", "version"}

// TestCLI_Help: `spotagent help`, --help and -h list the commands on
// stdout and exit 0; `spotagent CMD --help` and -h print CMD's usage on
// stdout and exit 0, before doing anything (no store, no socket).
func TestCLI_Help(t *testing.T) {
	parallel(t)
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, out, _ := runCLI(t, nil, args...)
		if code != 0 {
			t.Errorf("spotagent %s: exit code %d, want 0", args[0], code)
		}
		for _, c := range cliCommands {
			if !strings.Contains(out, "\n  "+c+" ") {
				t.Errorf("spotagent %s: %q not listed on stdout:\n%s", args[0], c, out)
			}
		}
	}
	for _, c := range cliCommands {
		for _, h := range []string{"--help", "-h"} {
			code, out, errOut := runCLI(t, nil, c, h)
			if code != 0 {
				t.Errorf("spotagent %s %s: exit code %d, want 0\n%s", c, h, code, errOut)
			}
			if !strings.Contains(out, "usage: spotagent "+c) {
				t.Errorf("spotagent %s %s: no usage on stdout:\n%s", c, h, out)
			}
		}
	}
	code, out, _ := runCLI(t, nil, "help", "restore")
	if code != 0 || !strings.Contains(out, "-dest") {
		t.Errorf("spotagent help restore: exit code %d, output:\n%s", code, out)
	}
}

// TestCLI_BadUsage: an unknown flag, an unknown command or no command
// exits 2 with the reason on stderr.
func TestCLI_BadUsage(t *testing.T) {
	parallel(t)
	for _, args := range [][]string{{"run", "--no-such-flag", "--", "true"}, {"restore", "--bogus"},
		{"status", "-x"}, {"version", "--nope"}, {"no-such-command"}, {}} {
		code, _, errOut := runCLI(t, nil, args...)
		if code != 2 {
			t.Errorf("spotagent %s: exit code %d, want 2", strings.Join(args, " "), code)
		}
		if errOut == "" {
			t.Errorf("spotagent %s: nothing on stderr", strings.Join(args, " "))
		}
	}
}

// TestCLI_TrainerNotRunnable: `spotagent run -- CMD` exits 127 when CMD is
// not found and 126 when it is not executable, as shells do, with the
// reason in one line.
func TestCLI_TrainerNotRunnable(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	noexec := filepath.Join(dir, "train.sh")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		command string
		code    int
		msg     string
	}{
		{"NotFound", "spotagent-no-such-trainer", 127, `spotagent run: .*"spotagent-no-such-trainer": executable file not found in \$PATH`},
		{"NotFoundPath", filepath.Join(dir, "missing.sh"), 127, `spotagent run: .*missing.sh: no such file or directory`},
		{"NotExecutable", noexec, 126, `spotagent run: .*train.sh"?: permission denied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(dir, tc.name)
			code, _, errOut := runCLI(t, nil, "run", "--store", "file://"+filepath.Join(d, "store"), "--run-id", "cli",
				"--checkpoint-dir", filepath.Join(d, "ckpt"), "--socket", filepath.Join(d, "a.sock"), "--cloud", "none",
				"--", tc.command)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d\n%s", code, tc.code, errOut)
			}
			if !regexp.MustCompile(tc.msg).MatchString(errOut) {
				t.Fatalf("stderr does not match %q:\n%s", tc.msg, errOut)
			}
		})
	}
}

// TestCLI_Restore: `spotagent restore --dest DIR` puts the checkpoint's
// files directly in DIR and prints which checkpoint it was; it refuses a
// non-empty DIR (exit 1, DIR untouched) unless --force, which replaces
// DIR's contents with exactly the checkpoint's.
func TestCLI_Restore(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(dir, "ckpt")
	if err := os.MkdirAll(filepath.Join(ckpt, "opt"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"model.pt": "weights", "opt/state": "moments"} {
		if err := os.WriteFile(filepath.Join(ckpt, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &commit.Committer{Store: st, RunID: "cli"}
	if _, err := c.Commit(context.Background(), commit.Request{Dir: ckpt, ID: "c42", Step: 42, Reason: "manual"}); err != nil {
		t.Fatal(err)
	}
	store := "file://" + filepath.Join(dir, "store")
	dest := filepath.Join(dir, "dest")

	code, out, errOut := runCLI(t, nil, "restore", "--store", store, "--dest", dest)
	if code != 0 {
		t.Fatalf("restore: exit code %d\n%s", code, errOut)
	}
	if !strings.Contains(out, "restored step 42 (checkpoint c42,") || !strings.Contains(out, "into "+dest) {
		t.Fatalf("restore printed %q, want the step, the checkpoint id and the directory", out)
	}
	sameFile(t, filepath.Join(ckpt, "model.pt"), filepath.Join(dest, "model.pt"))
	sameFile(t, filepath.Join(ckpt, "opt", "state"), filepath.Join(dest, "opt", "state"))

	if err := os.WriteFile(filepath.Join(dest, "stale"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCLI(t, nil, "restore", "--store", store, "--dest", dest)
	if code != 1 || !strings.Contains(errOut, "not empty: --force replaces its contents") {
		t.Fatalf("restore into a non-empty dir: exit code %d, stderr %q; want 1 and the reason", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dest, "stale")); err != nil {
		t.Fatalf("a refused restore touched the directory: %v", err)
	}

	code, _, errOut = runCLI(t, nil, "restore", "--store", store, "--dest", dest, "--force", "--id", "c42")
	if code != 0 {
		t.Fatalf("restore --force: exit code %d\n%s", code, errOut)
	}
	ents, err := os.ReadDir(dest)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), "model.pt opt"; got != want {
		t.Fatalf("after --force dest holds %q, want %q", got, want)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Fatalf("restore left something beside dest: %v", ents)
	}
}

// TestCLI_BadStoreURI: a store URI that cannot be opened is a usage error
// (exit 2, as other bad flag values; systemd does not restart on it), said
// before anything is logged as the effective configuration, and nothing is
// touched: no checkpoint directory, no socket, no relative "store".
func TestCLI_BadStoreURI(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	for _, c := range []struct{ cmd, flag, uri string }{
		{"run", "--store", "http://my-bucket/runs/x"},
		{"run", "--store", "s3:/my-bucket"},
		{"run", "--store", "file://relative/store"},
		{"run", "--store", "gs://Upper-Case/x"},
		{"sidecar", "--store", "https://my-bucket/x"},
		{"node", "--store-prefix", "s3:/my-bucket"},
	} {
		args := []string{c.cmd, c.flag, c.uri, "--cloud", "none", "--socket", filepath.Join(dir, "a.sock")}
		if c.cmd != "node" {
			args = append(args, "--checkpoint-dir", filepath.Join(dir, "ckpt"))
		}
		if c.cmd == "run" {
			args = append(args, "--", "true")
		}
		code, _, errOut := runCLI(t, nil, args...)
		if code != 2 {
			t.Errorf("spotagent %s %s %s: exit code %d, want 2\n%s", c.cmd, c.flag, c.uri, code, errOut)
		}
		if !strings.Contains(errOut, c.flag+": ") || !strings.Contains(errOut, c.uri) {
			t.Errorf("spotagent %s %s %s: stderr does not name the flag and the URI:\n%s", c.cmd, c.flag, c.uri, errOut)
		}
		if strings.Contains(errOut, "effective configuration") {
			t.Errorf("spotagent %s %s %s: logged an effective configuration before refusing it:\n%s", c.cmd, c.flag, c.uri, errOut)
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("bad store URIs touched %s: %v %v", dir, ents, err)
	}
	if _, err := os.Stat(filepath.Join(repo, "relative")); err == nil {
		t.Fatalf("file://relative/store created %s", filepath.Join(repo, "relative"))
	}
}
