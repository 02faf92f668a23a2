package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// A simulated job of ddpNodes nodes × ddpRanks ranks on this machine: one
// agent per node (own socket, checkpoint directory and fake metadata
// service), each wrapping the real torchrun (its elastic agent, static
// rendezvous on loopback; python/examples/torchrun.py is torchrun on
// Debian's torch 1.13 under Python 3.11), ranks training a small DDP model
// with gloo (python/examples/train_ddp.py), one shared S3 store.
const (
	ddpNodes = 2
	ddpRanks = 2
	ddpSteps = "400"
)

// torchrunCmd is node k's torchrun command line for a job of nodes × ranks
// whose rendezvous (node 0's store) listens on port; script and its args
// follow.
func torchrunCmd(nodes, k, ranks, port int, script ...string) []string {
	return append([]string{python, "python/examples/torchrun.py", "--nnodes", strconv.Itoa(nodes),
		"--node_rank", strconv.Itoa(k), "--nproc_per_node", strconv.Itoa(ranks),
		"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port)}, script...)
}

// ddpLauncher is the command line of node k's launcher: the documented
// `spotagent run --node-rank K -- torchrun --nnodes 2 --node_rank K ...`.
func ddpLauncher(k, port int) []string {
	return torchrunCmd(ddpNodes, k, ddpRanks, port, "python/examples/train_ddp.py")
}

// ddpEnv is the trainers' environment (steps, pacing).
func ddpEnv(sleepMS int) []string {
	return []string{"TOTAL_STEPS=" + ddpSteps, "STEP_SLEEP_MS=" + strconv.Itoa(sleepMS), "PYTHONUNBUFFERED=1"}
}

// freePort is a TCP port nobody listens on (for MASTER_PORT).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var finalRx = regexp.MustCompile(`rank (\d+) final sha256=([0-9a-f]{64}) step=(\d+)`)

// finals collects every rank's final line from the outputs.
func finals(t *testing.T, outs ...string) map[int]string {
	t.Helper()
	got := map[int]string{}
	for _, out := range outs {
		for _, m := range finalRx.FindAllStringSubmatch(out, -1) {
			got[atoi(t, m[1])] = m[2] + " step=" + m[3]
		}
	}
	return got
}

// ddpReference runs the job once without agents, uninterrupted.
func ddpReference(t *testing.T) map[int]string {
	t.Helper()
	port := freePort(t)
	var procs []*proc
	for k := 0; k < ddpNodes; k++ {
		cmd := exec.Command(ddpLauncher(k, port)[0], ddpLauncher(k, port)[1:]...)
		cmd.Dir = repo
		cmd.Env = append(cleanEnv(), ddpEnv(0)...)
		procs = append(procs, startCmd(t, cmd))
	}
	var outs []string
	for _, p := range procs {
		if code := p.wait(3 * time.Minute); code != 0 {
			t.Fatalf("reference job exited %d:\n%s", code, p.output())
		}
		outs = append(outs, p.output())
	}
	ref := finals(t, outs...)
	if len(ref) != ddpNodes*ddpRanks {
		t.Fatalf("reference job: final lines of %d ranks, want %d:\n%s", len(ref), ddpNodes*ddpRanks, strings.Join(outs, "\n"))
	}
	return ref
}

// cleanEnv is the test's environment without spotagent's variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPOTAGENT_") {
			env = append(env, kv)
		}
	}
	return env
}

// ddpJob starts one agent per node; notices[k] is node k's fake cloud.
type ddpJob struct {
	agents  []*proc
	notices []fake.Server
}

func startDDPJob(t *testing.T, env []string, uri, dir string, sleepMS int, extra ...string) *ddpJob {
	t.Helper()
	port := freePort(t)
	j := &ddpJob{}
	for k := 0; k < ddpNodes; k++ {
		fk := startFake(t, "aws")
		nd := filepath.Join(dir, fmt.Sprintf("n%d", k))
		args := []string{"run", "--store", uri, "--run-id", "it",
			"--checkpoint-dir", filepath.Join(nd, "ckpt"), "--socket", filepath.Join(dir, fmt.Sprintf("n%d.sock", k)),
			"--interval", "1h", "--poll-interval", "100ms", "--log-format", "json", "--node-rank", strconv.Itoa(k)}
		args = append(args, cloudArgs(t, "aws", fk.URL())...)
		args = append(args, extra...)
		args = append(append(args, "--"), ddpLauncher(k, port)...)
		j.agents = append(j.agents, start(t, append(append([]string{}, env...), ddpEnv(sleepMS)...), args...))
		j.notices = append(j.notices, fk)
	}
	return j
}

// TestDistributed_NoticeOnOneNode is issue #15's proof: a spot notice on
// node 1 only; all 4 ranks save the same step into one checkpoint of two
// parts; every rank stops; a fresh job resumes bit-identically.
func TestDistributed_NoticeOnOneNode(t *testing.T) {
	requirePython(t, true)
	s3srv, err := s3test.Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3srv.Close)
	env := s3Env(s3srv)
	setenvPairs(t, env)
	ref := ddpReference(t)
	uri := "s3://" + s3srv.Bucket + "/ddp"
	st := openTestStore(t, uri, all.Options{})

	first := startDDPJob(t, env, uri, shortTemp(t), 50) // ranks at different speeds: 0–50 ms a step each
	first.agents[0].waitLine(`rank 0 step 30\b`, 3*time.Minute)
	first.notices[1].Notice()
	for k, a := range first.agents {
		if code := a.wait(3 * time.Minute); code != exitInterrupted {
			t.Fatalf("node %d: agent exit code %d, want %d", k, code, exitInterrupted)
		}
	}
	l := readLatestPointer(t, st)
	m, err := checkpoint.ReadManifest(t.Context(), st, l.Manifest)
	if err != nil {
		t.Fatalf("latest.json names %s: %v", l.Manifest, err)
	}
	if m.Reason != "interruption" {
		t.Errorf("job checkpoint reason %q, want interruption", m.Reason)
	}
	var nodes []string
	for _, p := range m.Parts {
		nodes = append(nodes, p.Node)
	}
	sort.Strings(nodes)
	if strings.Join(nodes, ",") != "node-0,node-1" {
		t.Fatalf("job checkpoint has parts %v, want node-0 and node-1", nodes)
	}
	ranks := map[string]string{}
	for _, f := range m.Files {
		ranks[f.Path] = f.Part
	}
	for r := 0; r < ddpNodes*ddpRanks; r++ {
		name := fmt.Sprintf("rank-%d.pt", r)
		if want := fmt.Sprintf("node-%d", r/ddpRanks); ranks[name] != want {
			t.Errorf("%s in part %q, want %q (files: %v)", name, ranks[name], want, ranks)
		}
	}
	// Every rank saved the step the manifest names.
	for k, a := range first.agents {
		saved := regexp.MustCompile(`rank (\d+) checkpoint \S+ \(interruption\) at step (\d+)`).FindAllStringSubmatch(a.output(), -1)
		if len(saved) != ddpRanks {
			t.Errorf("node %d: %d ranks took the interruption checkpoint, want %d", k, len(saved), ddpRanks)
		}
		for _, mm := range saved {
			if s := atoi(t, mm[2]); int64(s) != m.Step {
				t.Errorf("node %d: rank %s saved step %d, the job checkpoint is step %d", k, mm[1], s, m.Step)
			}
		}
	}
	j := noticeJournal(t, st)
	if n := len(j.Interruptions); n != 1 {
		t.Errorf("journal has %d interruptions, want 1 (the joined node records none)", n)
	}

	second := startDDPJob(t, env, uri, shortTemp(t), 0)
	var outs []string
	for k, a := range second.agents {
		if code := a.wait(3 * time.Minute); code != 0 {
			t.Fatalf("node %d: resumed agent exit code %d", k, code)
		}
		a.waitLine(fmt.Sprintf(`rank \d+ resuming from step %d\b`, m.Step), time.Second)
		outs = append(outs, a.output())
	}
	got := finals(t, outs...)
	for r, want := range ref {
		if got[r] != want {
			t.Errorf("rank %d: resumed job ended with %s, uninterrupted with %s", r, got[r], want)
		}
	}
}
