package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// copiesArgs is the args of spec's copies init container, its $(VAR)s
// expanded from env as the kubelet does (an unset one stays as written).
func copiesArgs(t *testing.T, spec corev1.PodSpec, env map[string]string) []string {
	t.Helper()
	for _, c := range spec.InitContainers {
		if c.Name != "copies" {
			continue
		}
		if len(c.Command) != 0 || len(c.Args) == 0 || c.Args[0] != "prepare-copies" {
			t.Fatalf("copies command %q args %q: want the agent image's prepare-copies", c.Command, c.Args)
		}
		args := slices.Clone(c.Args)
		for i, a := range args {
			for k, v := range env {
				a = strings.ReplaceAll(a, "$("+k+")", v)
			}
			if strings.Contains(a, "$(") {
				t.Fatalf("copies arg %q: a variable the pod does not set", a)
			}
			args[i] = a
		}
		return args
	}
	t.Fatal("no copies init container")
	return nil
}

// TestCopiesInitContainer (#45): the copies init container, as the
// shipped manifests carry it (the agent image's `spotagent
// prepare-copies`, internal/hostcopies), run with its args on a directory
// standing for the hostPath root (the test runs as root in CI, as the
// container does): it makes <namespace>/<run>/node-<rank> and hands it to
// the pod's uid, mode 0700; a run of the same name in another namespace
// keeps its own directory; a symbolic link on the path is refused (its
// chown would land where the link points), and so is a <namespace> or
// <run> directory that anyone but root may write (they could put a link
// there after the check); other runs' copies with nothing newer than
// retainDays are removed (an earlier version's <run>/node-<rank> too),
// fresh ones are not.
func TestCopiesInitContainer(t *testing.T) {
	bin := spotagentBinary(t)
	js, _ := readJobSet(t)
	jsSpec := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec
	rt, _ := runtimeDocs(t, trainerRuntimePath)
	_, rtTmpl := runtimePodTemplate(t, rt)
	single := only[*batchv1.Job](t, decodeManifests(t, "kubernetes/sidecar-job.yaml"))
	for _, tc := range []struct {
		name  string
		spec  corev1.PodSpec
		run   string // the run id the pod's labels give it
		index string // JOB_COMPLETION_INDEX ("": the single-pod Job's node-0)
	}{
		{"jobset", jsSpec, js.Metadata.Name, "1"},
		{"kubeflow runtime", rtTmpl.Spec, "exp42", "1"},
		{"sidecar job", single.Spec.Template.Spec, single.Name, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			run := func(ns string) ([]byte, error) {
				env := map[string]string{"POD_NAMESPACE": ns, "SPOTAGENT_RUN_ID": tc.run}
				if tc.index != "" {
					env["JOB_COMPLETION_INDEX"] = tc.index
				}
				args := copiesArgs(t, tc.spec, env)
				for i, a := range args {
					if a == "--root=/copies" {
						args[i] = "--root=" + root
					}
				}
				cmd := exec.Command(bin, args...)
				cmd.Env = []string{"PATH=/usr/bin:/bin"}
				return cmd.CombinedOutput()
			}
			node := "node-0"
			if tc.index != "" {
				node = "node-" + tc.index
			}
			old := time.Now().Add(-30 * 24 * time.Hour)
			age := func(dir string) {
				filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, old, old) })
			}
			mk := func(parts ...string) string {
				d := filepath.Join(append([]string{root}, parts...)...)
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "model.pt"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				return d
			}
			// Other runs: the same name in another namespace (fresh), a
			// stale run, an earlier version's stale <run>/node-0, and a
			// fresh run of this namespace.
			sameName := mk("team-b", tc.run, node)
			stale := mk("team-b", "exp-old", "node-0")
			age(filepath.Join(root, "team-b", "exp-old"))
			legacy := mk("exp-legacy", "node-0")
			age(filepath.Join(root, "exp-legacy"))
			fresh := mk("team-a", "exp-fresh", "node-0")

			if out, err := run("team-a"); err != nil {
				t.Fatalf("the init container failed: %v\n%s", err, out)
			}
			dir := filepath.Join(root, "team-a", tc.run, node)
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatalf("no %s: %v", dir, err)
			}
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("%s: mode %v, want 0700", dir, fi.Mode().Perm())
			}
			if st := fi.Sys().(*syscall.Stat_t); os.Getuid() == 0 && (st.Uid != 1000 || st.Gid != 1000) {
				t.Errorf("%s: owned by %d:%d, want the pod's uid 1000:1000", dir, st.Uid, st.Gid)
			}
			for _, keep := range []string{sameName, fresh} {
				if _, err := os.Stat(filepath.Join(keep, "model.pt")); err != nil {
					t.Errorf("%s removed or emptied: %v", keep, err)
				}
			}
			for _, gone := range []string{stale, legacy} {
				if _, err := os.Stat(gone); !os.IsNotExist(err) {
					t.Errorf("%s: a run with nothing newer than retainDays is kept (%v)", gone, err)
				}
			}

			// A symbolic link where the run's directory goes: refused, and
			// nothing where it points is touched.
			target := mk("team-c", "victim", node)
			if err := os.Chmod(target, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "team-d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(root, "team-c", "victim"), filepath.Join(root, "team-d", tc.run)); err != nil {
				t.Fatal(err)
			}
			out, err := run("team-d")
			if err == nil || !strings.Contains(string(out), "symbolic link") {
				t.Errorf("a symbolic link at team-d/%s: err %v, output %q; want refused, saying why", tc.run, err, out)
			}
			if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
				t.Errorf("the link's target %s was changed: %v %v", target, fi.Mode(), err)
			}

			// A <namespace> or <run> directory that others may write (group-
			// or world-writable; or, as root, one the trainer's uid owns: an
			// earlier layout's node-<rank> whose name the path reuses): they
			// could swap node-<rank> for a link between the check and the
			// chown, so it is refused before the chown.
			refused := func(ns string) {
				t.Helper()
				out, err := run(ns)
				if err == nil || !strings.Contains(string(out), "alone may write: refused") {
					t.Errorf("namespace %s: err %v, output %q; want refused, saying why", ns, err, out)
				}
				d := filepath.Join(root, ns, tc.run, node)
				if fi, err := os.Stat(d); err == nil && fi.Mode().Perm() == 0o700 {
					t.Errorf("%s: made and handed over despite the refusal", d)
				}
			}
			for _, w := range []os.FileMode{0o775, 0o757} {
				ns := "team-w" + strconv.FormatUint(uint64(w), 8)
				if err := os.MkdirAll(filepath.Join(root, ns, tc.run), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(filepath.Join(root, ns, tc.run), w); err != nil {
					t.Fatal(err)
				}
				refused(ns)
			}
			if os.Getuid() == 0 {
				if err := os.MkdirAll(filepath.Join(root, "team-u", tc.run), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(filepath.Join(root, "team-u", tc.run), 1000, 1000); err != nil {
					t.Fatal(err)
				}
				refused("team-u")
			}
		})
	}
}
