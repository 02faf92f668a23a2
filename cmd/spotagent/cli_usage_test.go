package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// These ran the built binary in integration/ until issue 49 item 4; main
// is `os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))` after the
// trainer guard, so execute in-process answers the same.

// TestCLI_CommandHelp: `spotagent CMD --help` and -h print CMD's usage on
// stdout and exit 0 for every command, before doing anything (no store,
// no socket); `spotagent help`, --help and -h list every command (and the
// table holds the ones users rely on); `help CMD` is CMD's help.
func TestCLI_CommandHelp(t *testing.T) {
	var names []string
	for _, mk := range commands {
		names = append(names, mk().Name())
	}
	// The commands users and the docs rely on, whatever the table holds.
	for _, c := range []string{"run", "sidecar", "node", "status", "list", "restore", "history", "report", "fleet",
		"watch", "simulate", "fake-metadata", "version"} {
		if !slices.Contains(names, c) {
			t.Errorf("no command %q", c)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, list, _ := cli(t, args...)
		for _, c := range names {
			if code != 0 || !strings.Contains(list, "\n  "+c+" ") {
				t.Errorf("spotagent %s: exit %d, %q not listed:\n%s", args[0], code, c, list)
			}
		}
	}
	for _, c := range names {
		for _, h := range []string{"--help", "-h"} {
			code, out, errOut := cli(t, c, h)
			if code != 0 || !strings.Contains(out, "usage: spotagent "+c) {
				t.Errorf("spotagent %s %s: exit %d, no usage on stdout:\n%s%s", c, h, code, out, errOut)
			}
		}
	}
	if code, out, _ := cli(t, "help", "restore"); code != 0 || !strings.Contains(out, "-dest") {
		t.Errorf("spotagent help restore: exit %d:\n%s", code, out)
	}
}

// TestCLI_BadUsage: an unknown flag, an unknown command or no command
// exits 2 with the reason on stderr.
func TestCLI_BadUsage(t *testing.T) {
	for _, args := range [][]string{{"run", "--no-such-flag", "--", "true"}, {"restore", "--bogus"},
		{"status", "-x"}, {"version", "--nope"}, {"no-such-command"}, {}} {
		code, _, errOut := cli(t, args...)
		if code != 2 || errOut == "" {
			t.Errorf("spotagent %s: exit %d, stderr %q; want 2 and the reason", strings.Join(args, " "), code, errOut)
		}
	}
}

// TestCLI_TrainerNotRunnable: `spotagent run -- CMD` exits 127 when CMD is
// not found and 126 when it is not executable, as shells do, with the
// reason in one line.
func TestCLI_TrainerNotRunnable(t *testing.T) {
	dir := shortTempDir(t)
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
			code, _, errOut := cli(t, "run", "--store", "file://"+filepath.Join(d, "store"), "--run-id", "cli",
				"--checkpoint-dir", filepath.Join(d, "ckpt"), "--socket", filepath.Join(d, "a.sock"), "--cloud", "none",
				"--", tc.command)
			if code != tc.code || !regexp.MustCompile(tc.msg).MatchString(errOut) {
				t.Fatalf("exit %d, stderr %q; want %d matching %q", code, errOut, tc.code, tc.msg)
			}
		})
	}
}

// TestCLI_RestoreDest: `spotagent restore --dest DIR` puts the
// checkpoint's files directly in DIR and prints which checkpoint it was;
// it refuses a non-empty DIR (exit 1, DIR untouched) unless --force, which
// replaces DIR's contents with exactly the checkpoint's.
func TestCLI_RestoreDest(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(dir, "ckpt")
	files := map[string]string{"model.pt": "weights", "opt/state": "moments"}
	for name, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ckpt, name)), 0o700); err != nil {
			t.Fatal(err)
		}
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

	code, out, errOut := cli(t, "restore", "--store", store, "--dest", dest)
	if code != 0 || !strings.Contains(out, "restored step 42 (checkpoint c42,") || !strings.Contains(out, "into "+dest) {
		t.Fatalf("restore: exit %d, stdout %q, stderr %q; want the step, the checkpoint id and the directory", code, out, errOut)
	}
	for name, body := range files {
		if b, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(b) != body {
			t.Fatalf("restored %s: %q %v, want %q", name, b, err, body)
		}
	}

	if err := os.WriteFile(filepath.Join(dest, "stale"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = cli(t, "restore", "--store", store, "--dest", dest)
	if code != 1 || !strings.Contains(errOut, "not empty: --force replaces its contents") {
		t.Fatalf("restore into a non-empty dir: exit %d, stderr %q; want 1 and the reason", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dest, "stale")); err != nil {
		t.Fatalf("a refused restore touched the directory: %v", err)
	}

	if code, _, errOut = cli(t, "restore", "--store", store, "--dest", dest, "--force", "--id", "c42"); code != 0 {
		t.Fatalf("restore --force: exit %d\n%s", code, errOut)
	}
	var names []string
	ents, err := os.ReadDir(dest)
	if err != nil {
		t.Fatal(err)
	}
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
	dir := shortTempDir(t)
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
		code, _, errOut := cli(t, args...)
		if code != 2 || !strings.Contains(errOut, c.flag+": ") || !strings.Contains(errOut, c.uri) {
			t.Errorf("spotagent %s %s %s: exit %d, stderr %q; want 2 naming the flag and the URI", c.cmd, c.flag, c.uri, code, errOut)
		}
		if strings.Contains(errOut, "effective configuration") {
			t.Errorf("spotagent %s %s %s: logged an effective configuration before refusing it:\n%s", c.cmd, c.flag, c.uri, errOut)
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("bad store URIs touched %s: %v %v", dir, ents, err)
	}
	if _, err := os.Stat("relative"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("file://relative/store created ./relative")
	}
}

// TestRun_BadStore: a store that cannot work fails with one clear line
// before the trainer is launched: exit 2 for a malformed --store (usage),
// 1 for a store that fails (a missing bucket, an endpoint nobody serves).
func TestRun_BadStore(t *testing.T) {
	srv := s3test.New(t)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, tc := range []struct {
		name, store, endpoint string
		want                  string
		code                  int
	}{
		{"unknown scheme", "ftp://host/x", "", "scheme", 2},
		{"malformed uri", "s3://", "", "bucket", 2},
		{"missing bucket", "s3://nope/x", "", "does not exist", 1},
		{"unreachable endpoint", "s3://" + srv.Bucket + "/x", "http://127.0.0.1:1", "unreachable", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.endpoint != "" {
				t.Setenv("AWS_ENDPOINT_URL_S3", tc.endpoint)
			}
			dir := shortTempDir(t)
			marker := filepath.Join(dir, "trainer-ran")
			code, _, errOut := cli(t, "run", "--store", tc.store, "--run-id", "it", "--cloud", "none",
				"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
				"--", "/bin/sh", "-c", "touch "+marker)
			line := regexp.MustCompile(`(?m)^spotagent run: .*`).FindString(errOut)
			if code != tc.code || !strings.Contains(line, tc.want) {
				t.Fatalf("exit %d, error line %q; want %d saying %q\n%s", code, line, tc.code, tc.want, errOut)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the trainer was launched")
			}
		})
	}
}

// TestWatch_BadInput: a bad --watch setting is a clear error before any
// trainer runs.
func TestWatch_BadInput(t *testing.T) {
	dir := shortTempDir(t)
	store := "file://" + filepath.Join(dir, "store")
	out := filepath.Join(dir, "out")
	ckpt := filepath.Join(dir, "ckpt")
	for _, d := range []string{out, ckpt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	watch := func(watchDir string, extra ...string) []string {
		return append([]string{"run", "--store", store, "--run-id", "it", "--cloud", "none", "--watch", watchDir,
			"--checkpoint-dir", ckpt, "--socket", filepath.Join(dir, "a.sock")}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"pattern", watch(out, "--watch-pattern", "a/b"), "without '/'"},
		{"regex", watch(out, "--watch-step-regex", "("), "watch step regex"},
		{"signal", watch(out, "--notice-signal", "SIGKILL"), "--notice-signal"},
		{"overlap", watch(ckpt), "checkpoint-dir"},
		{"no-watch", []string{"run", "--store", store, "--notice-signal", "SIGTERM"}, "need --watch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cli(t, append(tc.args, "--", "/bin/sh", "-c", "touch "+dir+"/ran")...)
			if code == 0 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want an error saying %q", code, errOut, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
				t.Fatal("the trainer ran")
			}
		})
	}
	if os.Getuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := cli(t, append(watch(ro), "--", "/bin/true")...); code == 0 || !strings.Contains(errOut, "not writable") {
			t.Fatalf("read-only --watch dir: exit %d, stderr %q", code, errOut)
		}
	}
}

// TestRun_RestoresWhileTheTrainerStarts: `spotagent run` restores beside
// its trainer's start by default (the trainer's environment says
// SPOTAGENT_RESUME=pending and names no directory), and before it with
// --restore-serial (SPOTAGENT_RESUME_DIR names the restored checkpoint).
// What each way holds is pkg/supervisor's TestAgent_OverlapRestore* and
// the agent simulation's; this is the flag's wiring.
func TestRun_RestoresWhileTheTrainerStarts(t *testing.T) {
	_, uri := testStore(t, nil)
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"default", nil, "resume=pending dir=\n"},
		{"serial", []string{"--restore-serial"}, "resume= dir=set\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := shortTempDir(t)
			out := filepath.Join(d, "env")
			args := append([]string{"run", "--store", uri, "--run-id", "exp1", "--cloud", "none", "--interval", "1h",
				"--checkpoint-dir", filepath.Join(d, "ckpt"), "--socket", filepath.Join(d, "a.sock")}, tc.extra...)
			args = append(args, "--", "/bin/sh", "-c", `echo "resume=$SPOTAGENT_RESUME dir=${SPOTAGENT_RESUME_DIR:+set}" > `+out)
			if code, _, errOut := cli(t, args...); code != 0 {
				t.Fatalf("exit %d\n%s", code, errOut)
			}
			if b, err := os.ReadFile(out); err != nil || string(b) != tc.want {
				t.Fatalf("the trainer's environment: %q (%v), want %q", b, err, tc.want)
			}
		})
	}
}
