package deploy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// shippedTrainers is every shipped manifest's trainer container, by file.
func shippedTrainers(t *testing.T) map[string]corev1.Container {
	t.Helper()
	out := map[string]corev1.Container{}
	add := func(path string, spec corev1.PodSpec) {
		for _, c := range spec.Containers {
			if c.Name == "trainer" {
				out[path] = c
			}
		}
	}
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if path == jobSetPath {
			js, _ := readJobSet(t)
			add(path, js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec)
			continue
		}
		for _, o := range decodeManifests(t, path) {
			switch o := o.(type) {
			case *corev1.Pod:
				add(path, o.Spec)
			case *batchv1.Job:
				add(path, o.Spec.Template.Spec)
			case *appsv1.DaemonSet:
				add(path, o.Spec.Template.Spec)
			}
		}
	}
	return out
}

// TestTrainerPID1HandlesSIGTERM (#37 item 2): the trainer container's main
// process is PID 1 of its container, which drops a signal it has no handler
// for. In every shipped manifest it is either the Python trainer itself
// (exec form) with the client's SIGTERM handler on, or a shell script that
// traps SIGTERM, forwards it to torchrun and keeps the exit file's 75;
// the script passes shellcheck as POSIX sh. integration/k8s_pid1_test.go
// runs the multi-node script as PID 1 of a PID namespace.
func TestTrainerPID1HandlesSIGTERM(t *testing.T) {
	trainers := shippedTrainers(t)
	if len(trainers) < 4 {
		t.Fatalf("trainer containers found in %d manifests, want the 4 that ship one (sidecar, multi-node Job and JobSet, node trainer): %v", len(trainers), trainers)
	}
	sc := need(t, "shellcheck", "shellcheck")
	for path, c := range trainers {
		t.Run(filepath.Base(path), func(t *testing.T) {
			if len(c.Command) == 0 {
				t.Fatal("no command: the image's entrypoint would be PID 1, unchecked")
			}
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			if c.Command[0] != "sh" && c.Command[0] != "bash" {
				if !strings.HasPrefix(c.Command[0], "python") || env["SPOTAGENT_HANDLE_SIGTERM"] != "1" {
					t.Errorf("command %q: an exec-form trainer must be the interpreter with SPOTAGENT_HANDLE_SIGTERM=1", c.Command)
				}
				return
			}
			if len(c.Command) != 3 || c.Command[1] != "-c" {
				t.Fatalf("command %q: want sh -c SCRIPT", c.Command)
			}
			script := c.Command[2]
			for _, want := range []string{`trap 'sig=1; kill -TERM $pid`, "' TERM INT", "wait $pid", `torchrun `, ` &` + "\n" + `pid=$!`, "exit 75",
				`lost=${SPOTAGENT_PEER_LOST:-$(dirname "$SPOTAGENT_SOCKET")/peer-lost}`} {
				if !strings.Contains(script, want) {
					t.Errorf("script lacks %q:\n%s", want, script)
				}
			}
			if env["SPOTAGENT_EXIT_FILE"] == "" || env["SPOTAGENT_HANDLE_SIGTERM"] != "1" {
				t.Error("the script needs SPOTAGENT_EXIT_FILE and SPOTAGENT_HANDLE_SIGTERM=1 in its env")
			}
			// The kubelet expands $(VAR) from the container's env first.
			sh := regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`).ReplaceAllString(script, `"$$$1"`)
			f := filepath.Join(t.TempDir(), "trainer.sh")
			if err := os.WriteFile(f, []byte("#!/bin/sh\n"+sh), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(sc, "--severity=style", "--shell=sh", f).CombinedOutput(); err != nil || len(out) > 0 {
				t.Errorf("shellcheck of the trainer script: %v\n%s", err, out)
			}
		})
	}
}

// TestTrainerScriptExitCodes runs each shipped trainer script with a
// stand-in torchrun that ends as the ranks' launcher would: the script
// must pass on what the client wrote to the exit file (75 run me again,
// 76 fenced: never 0), and a crash without it stays 1.
func TestTrainerScriptExitCodes(t *testing.T) {
	for path, c := range shippedTrainers(t) {
		if len(c.Command) != 3 || c.Command[0] != "sh" || !strings.Contains(c.Command[2], "torchrun ") {
			continue
		}
		sh := regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`).ReplaceAllString(c.Command[2], `"$$$1"`)
		for _, tc := range []struct {
			said string // written to the exit file by the ranks
			code int    // torchrun's own exit
			want int
		}{{"75", 1, 75}, {"76", 1, 76}, {"76", 137, 76}, {"", 1, 1}, {"", 0, 0}, {"75", 0, 0}} {
			t.Run(fmt.Sprintf("%s/said%s-exit%d", filepath.Base(path), tc.said, tc.code), func(t *testing.T) {
				dir := t.TempDir()
				exitFile := filepath.Join(dir, "exit")
				fake := fmt.Sprintf("#!/bin/sh\n[ -z %q ] || echo %q > %q\nexit %d\n", tc.said, tc.said, exitFile, tc.code)
				if err := os.WriteFile(filepath.Join(dir, "torchrun"), []byte(fake), 0o755); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command("sh", "-c", sh)
				cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "SPOTAGENT_EXIT_FILE="+exitFile,
					"SPOTAGENT_SOCKET="+filepath.Join(dir, "agent.sock"), "JOB_COMPLETION_INDEX=0", "JOB_INDEX=0", "REPLICATED_JOB_INDEX=0")
				err := cmd.Run()
				got := 0
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					got = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				if got != tc.want {
					t.Errorf("exit %d, want %d", got, tc.want)
				}
			})
		}
	}
}
