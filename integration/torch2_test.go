//go:build torch2

package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// Torch 2.x, Hugging Face and DCP, end to end: trainers run under the
// python3 of the Debian unstable root (torch 2.x, transformers,
// accelerate; scripts/sid-root.sh builds it, scripts/test-deps.sh installs
// it) through scripts/sid-python, against the real agent. Built with the
// torch2 tag: `make test-python` runs them (with the torch tests of the
// other files again under torch 2.x) in a go test of their own, outside
// test-go's 30-minute budget for this package.

const (
	hfExample  = "python/examples/hf_trainer.py"
	dcpExample = "python/examples/train_dcp.py"
	hfSteps    = "60"
)

// sidPython is scripts/sid-python once the root is there; it fails (never
// skips) when it is not: `make test` builds it.
func sidPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs torch 2.x trainers end to end (make test-python runs it)")
	}
	p := filepath.Join(repo, "scripts", "sid-python")
	out, err := exec.Command(p, "-c", "import torch, transformers; print(torch.__version__)").CombinedOutput()
	if err != nil {
		t.Fatalf("the torch 2.x root is missing or broken (run scripts/test-deps.sh): %v\n%s", err, out)
	}
	return p
}

// hfEnv keeps the Hugging Face libraries off the network and quiet.
var hfEnv = []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_DATASETS_OFFLINE=1",
	"TRANSFORMERS_VERBOSITY=error", "PYTHONUNBUFFERED=1"}

var hfFinalRx = regexp.MustCompile(`final sha256=([0-9a-f]{64}) step=(\d+)`)

// hfFinal is the final line's digest and step in out ("" when none).
func hfFinal(out string) string {
	if m := hfFinalRx.FindStringSubmatch(out); m != nil {
		return m[1] + " step=" + m[2]
	}
	return ""
}

// hfRef runs the Trainer example bare (no agent), uninterrupted, once per
// set of flags.
var hfRefs sync.Map

func hfRef(t *testing.T, py string, args ...string) string {
	t.Helper()
	key := strings.Join(args, " ")
	if v, ok := hfRefs.Load(key); ok {
		return v.(string)
	}
	dir := testutil.ShortDir(t)
	cmd := exec.Command(py, append([]string{hfExample, "--output-dir", filepath.Join(dir, "out"), "--steps", hfSteps}, args...)...)
	cmd.Dir = repo
	cmd.Env = append(cleanEnv(), hfEnv...)
	out, err := cmd.CombinedOutput()
	ref := hfFinal(string(out))
	if err != nil || ref == "" {
		t.Fatalf("reference run: %v\n%s", err, out)
	}
	hfRefs.Store(key, ref)
	return ref
}

// TestTorch2_HFCallback: the real Hugging Face Trainer (a tiny GPT-2 made
// from a config) with spotagent.hf.SpotagentCallback under `spotagent run`:
// a spot notice (fake AWS metadata), or SIGTERM to the agent, becomes the
// Trainer's own save at the next step end, committed; the trainer exits 75
// (the agent too); a new machine (empty disk, same store) resumes through
// resume_from_checkpoint and ends bit-identical to an uninterrupted run.
func TestTorch2_HFCallback(t *testing.T) {
	py := sidPython(t)
	ref := hfRef(t, py)
	for _, how := range []string{"notice", "sigterm"} {
		t.Run(how, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			store := "file://" + filepath.Join(dir, "store")
			trainer := func(m string) []string {
				return []string{"--", py, hfExample, "--output-dir", filepath.Join(dir, m, "out"), "--steps", hfSteps,
					"--step-sleep-ms", "150"}
			}
			fk := startFake(t, "aws")
			first := start(t, hfEnv, append(noticeArgs(filepath.Join(dir, "m1"), store, cloudArgs(t, "aws", fk.URL())...), trainer("m1")...)...)
			first.waitLine(`starting fresh`, 8*time.Minute)
			first.waitLine(`^step 5$`, 8*time.Minute)
			if how == "notice" {
				fk.(*fake.AWS).Terminate("terminate", time.Now().Add(90*time.Second))
			} else {
				first.signal(syscall.SIGTERM)
			}
			first.waitLine(`checkpoint committed`, 5*time.Minute)
			if code := first.wait(5 * time.Minute); code != exitInterrupted {
				t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
			}
			if hfFinal(first.output()) != "" {
				t.Fatal("the interrupted run finished training: the interruption came too late to test anything")
			}
			st := openTestStore(t, store, all.Options{})
			l := readLatestPointer(t, st)
			if l.Step < 5 {
				t.Fatalf("latest step %d, want the step the Trainer saved at or after step 5", l.Step)
			}

			fk2 := startFake(t, "aws")
			second := start(t, hfEnv, append(noticeArgs(filepath.Join(dir, "m2"), store, cloudArgs(t, "aws", fk2.URL())...), trainer("m2")...)...)
			second.waitLine(`resuming from \S+`, 8*time.Minute)
			if code := second.wait(10 * time.Minute); code != 0 {
				t.Fatalf("resumed run exit code %d", code)
			}
			if got := hfFinal(second.output()); got != ref {
				t.Fatalf("resumed from step %d: final %q, want %q (the uninterrupted run's)", l.Step, got, ref)
			}
			t.Logf("%s: committed step %d, resumed bit-identical", how, l.Step)
		})
	}
}

// TestTorch2_HFWatch: zero-code mode (`spotagent run --watch OUTPUT_DIR`)
// around the real Trainer saving checkpoint-<step> every 10 steps, with and
// without transformers' enable_jit_checkpoint. A notice: with JIT the agent
// signals the trainer (--notice-signal SIGTERM), the Trainer saves the
// current step (its incomplete sentinel removed once complete) and exits 0,
// the agent commits that checkpoint and exits 75; without, the agent commits
// the newest periodic checkpoint and stops the trainer. A new machine gets
// the checkpoint back under its name in OUTPUT_DIR, and the Trainer's own
// resume ends bit-identical to an uninterrupted run.
func TestTorch2_HFWatch(t *testing.T) {
	py := sidPython(t)
	for _, jit := range []bool{false, true} {
		name := "plain"
		if jit {
			name = "jit"
		}
		t.Run(name, func(t *testing.T) {
			flags := []string{"--mode", "watch"}
			if jit {
				flags = append(flags, "--jit")
			}
			ref := hfRef(t, py, flags...)
			dir := testutil.ShortDir(t)
			store := "file://" + filepath.Join(dir, "store")
			trainer := func(out string) []string {
				return append([]string{"--", py, hfExample, "--output-dir", out, "--steps", hfSteps, "--step-sleep-ms", "500"}, flags...)
			}
			extra := []string{"--kill-after", "60s"}
			if jit {
				extra = append(extra, "--notice-signal", "SIGTERM")
			}
			fk := startFake(t, "aws")
			out1 := mkdir(t, filepath.Join(dir, "m1", "out"))
			first := start(t, hfEnv, append(watchArgs(filepath.Join(dir, "m1"), out1, store,
				append(cloudArgs(t, "aws", fk.URL()), extra...)...), trainer(out1)...)...)
			first.waitLine(`starting fresh`, 8*time.Minute)
			first.waitLine(`checkpoint committed.*"step": 10`, 8*time.Minute)
			first.waitLine(`^step 13$`, 5*time.Minute)
			// Without a signal the agent lets the trainer run on until the
			// upload deadline, committing each newer checkpoint, then stops
			// it: a deadline the trainer (500 ms a step) cannot outrun.
			deadline := 90 * time.Second
			if !jit {
				deadline = 20 * time.Second
			}
			fk.(*fake.AWS).Terminate("terminate", time.Now().Add(deadline))
			if code := first.wait(6 * time.Minute); code != exitInterrupted {
				t.Fatalf("interrupted run exit code %d, want %d", code, exitInterrupted)
			}
			if hfFinal(first.output()) != "" {
				t.Fatal("the interrupted run finished training: the notice came too late to test anything")
			}
			st := openTestStore(t, store, all.Options{})
			l := readLatestPointer(t, st)
			if jit && l.Step < 13 {
				t.Fatalf("latest step %d: the JIT save on SIGTERM (after step 13) was not committed", l.Step)
			}
			if !jit && (l.Step%10 != 0 || l.Step < 10) {
				t.Fatalf("latest step %d, want a periodic save_steps checkpoint", l.Step)
			}
			man, err := checkpoint.ReadManifest(t.Context(), st, l.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range man.Files {
				if filepath.Base(f.Path) == "checkpoint-is-incomplete.txt" {
					t.Fatalf("committed checkpoint at step %d holds the incomplete sentinel", l.Step)
				}
			}

			fk2 := startFake(t, "aws")
			out2 := mkdir(t, filepath.Join(dir, "m2", "out"))
			second := start(t, hfEnv, append(watchArgs(filepath.Join(dir, "m2"), out2, store, cloudArgs(t, "aws", fk2.URL())...), trainer(out2)...)...)
			second.waitLine(`resuming from \S+/checkpoint-\d+`, 8*time.Minute)
			if code := second.wait(10 * time.Minute); code != 0 {
				t.Fatalf("resumed run exit code %d", code)
			}
			if got := hfFinal(second.output()); got != ref {
				t.Fatalf("resumed from step %d: final %q, want %q (the uninterrupted run's)", l.Step, got, ref)
			}
			t.Logf("%s: committed step %d, resumed bit-identical", name, l.Step)
		})
	}
}

// TestTorch2_DCPTorchrun: 2 nodes × 2 ranks under torch 2.x's own torchrun
// (the root's; libuv-less: c10d rendezvous with use_libuv=0), each node
// under `spotagent run --node-rank K`, checkpoints written by
// spotagent.dcp (DCP, sharded: each rank its slice). A notice on node 0:
// one job checkpoint, both agents exit 75. New machines (empty disks) each
// restore only their own part, every rank reads only its own shard file
// (bytes read per rank logged), and the job ends bit-identical to an
// uninterrupted one.
func TestTorch2_DCPTorchrun(t *testing.T) {
	py := sidPython(t)
	const nodes, ranks = 2, 2
	env := []string{"TOTAL_STEPS=200", "PYTHONUNBUFFERED=1"}
	launcher := func(k, port int) []string {
		return torch2Torchrun(py, nodes, k, ranks, port, dcpExample)
	}

	// The reference: the same job without agents.
	port := freePort(t)
	var refOuts []string
	var refs []*proc
	for k := 0; k < nodes; k++ {
		cmd := exec.Command(launcher(k, port)[0], launcher(k, port)[1:]...)
		cmd.Dir = repo
		cmd.Env = append(cleanEnv(), env...)
		refs = append(refs, startCmd(t, cmd))
	}
	for _, p := range refs {
		if code := p.wait(10 * time.Minute); code != 0 {
			t.Fatalf("reference job exited %d:\n%s", code, p.output())
		}
		refOuts = append(refOuts, p.output())
	}
	ref := finals(t, refOuts...)
	if len(ref) != nodes*ranks {
		t.Fatalf("reference: final lines of %d ranks, want %d", len(ref), nodes*ranks)
	}

	dir := testutil.ShortDir(t)
	store := "file://" + filepath.Join(dir, "store")
	run := func(m string, port int) ([]*proc, []fake.Server) {
		var agents []*proc
		var fakes []fake.Server
		for k := 0; k < nodes; k++ {
			fk := startFake(t, "aws")
			fakes = append(fakes, fk)
			nd := filepath.Join(dir, m, "node"+strconv.Itoa(k))
			args := append(noticeArgs(nd, store, cloudArgs(t, "aws", fk.URL())...),
				"--node-rank", strconv.Itoa(k), "--kill-after", "60s", "--")
			agents = append(agents, start(t, append(env, "STEP_SLEEP_MS=40"), append(args, launcher(k, port)...)...))
		}
		return agents, fakes
	}

	agents, fakes := run("m1", freePort(t))
	agents[0].waitLine(`rank 0 step 30$`, 8*time.Minute)
	fakes[0].(*fake.AWS).Terminate("terminate", time.Now().Add(90*time.Second))
	for k, a := range agents {
		if code := a.wait(6 * time.Minute); code != exitInterrupted {
			t.Fatalf("node %d's agent exit code %d, want %d", k, code, exitInterrupted)
		}
	}
	st := openTestStore(t, store, all.Options{})
	l := readLatestPointer(t, st)
	if l.Step < 30 {
		t.Fatalf("latest step %d, want the notice's checkpoint after step 30", l.Step)
	}

	agents, _ = run("m2", freePort(t))
	var outs []string
	for k, a := range agents {
		if code := a.wait(10 * time.Minute); code != 0 {
			t.Fatalf("resumed node %d's agent exit code %d", k, code)
		}
		outs = append(outs, a.output())
	}
	restoredRx := regexp.MustCompile(`rank (\d+) restored bytes=(\d+) files=(\S+) of=(\d+) step=(\d+)`)
	seen := 0
	for _, out := range outs {
		for _, m := range restoredRx.FindAllStringSubmatch(out, -1) {
			seen++
			if want := "__" + m[1] + "_0.distcp"; m[3] != want {
				t.Errorf("rank %s read %s, want only its own %s", m[1], m[3], want)
			}
			if atoi(t, m[5]) != int(l.Step) {
				t.Errorf("rank %s resumed at step %s, want %d", m[1], m[5], l.Step)
			}
			t.Logf("rank %s read %s bytes (%s) of the %s bytes of shard files its node restored", m[1], m[2], m[3], m[4])
		}
	}
	if seen != nodes*ranks {
		t.Fatalf("%d ranks reported their restore, want %d", seen, nodes*ranks)
	}
	got := finals(t, outs...)
	for r, want := range ref {
		if got[r] != want {
			t.Errorf("rank %d final %q, want %q (the uninterrupted job's)", r, got[r], want)
		}
	}
}

// torch2Torchrun is node k's command line for torch 2.x's own torchrun
// of the sid root, through python/examples/torchrun.py: Debian's torch 2.x
// is built without libuv, which torchrun's stores ask for; the wrapper
// makes them without it (docs/frameworks.md). The static rendezvous keeps
// --node-rank equal to the agent's.
func torch2Torchrun(py string, nodes, k, ranks, port int, script ...string) []string {
	return append([]string{py, "python/examples/torchrun.py", "--nnodes", strconv.Itoa(nodes), "--node-rank", strconv.Itoa(k),
		"--nproc-per-node", strconv.Itoa(ranks), "--master-addr", "127.0.0.1", "--master-port", strconv.Itoa(port)}, script...)
}
