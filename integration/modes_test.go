package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// trainerProc runs the stdlib example trainer as its own process, the way a
// trainer container runs beside a sidecar or under a node agent.
func trainerProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(python, append([]string{"python/examples/train.py"}, args...)...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	return startCmd(t, cmd)
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSidecar: the agent without a child, trainers in other processes on
// the shared socket, as in a pod whose trainer container is restarted in
// place and whose node is then preempted:
//   - the trainer container gets SIGTERM before its native sidecar; with
//     SPOTAGENT_HANDLE_SIGTERM=1 the client turns it into a final checkpoint
//     and exits 75 once the sidecar committed it;
//   - the container restarts in place: the sidecar (which started with
//     nothing to restore) hands the new trainer process the step committed,
//     restored from its local tier into its restore area, not from scratch;
//   - an AWS spot notice: that trainer's interruption checkpoint; metrics and
//     health on the side; the sidecar outlives the notice until the
//     kubelet's SIGTERM;
//   - the pod comes back on another node: a new sidecar restores from the
//     store and the trainer resumes and finishes.
//
// (TestSidecar_TrainerBackAfterCommitResumesIt was the first two steps on a
// sidecar of its own until #49.)
func TestSidecar(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	imds := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds.Close)
	sock := filepath.Join(dir, "run", "agent.sock")
	store := filepath.Join(dir, "store")
	maddr := testutil.FreeAddr(t)
	args := []string{"sidecar", "--store", "file://" + store, "--run-id", "pod",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", sock, "--interval", "1h",
		"--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", "100ms", "--metrics-addr", maddr}
	agent := start(t, nil, args...)
	agent.waitLine(`socket listening`, time.Minute)
	// Ready follows the socket by a moment: wait for it, bounded.
	testutil.WaitWithin(t, "/readyz 200", 30*time.Second, func() bool { return httpStatus(t, "http://"+maddr+"/readyz") == 200 })
	env := []string{"SPOTAGENT_SOCKET=" + sock, "SPOTAGENT_HANDLE_SIGTERM=1"}

	// The trainer container's SIGTERM: its final checkpoint, exit 75.
	tr := trainerProc(t, env, "--steps", "2000", "--step-time", "0.01")
	tr.waitLine(`^step 50 `, time.Minute)
	if err := tr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	shutdown := atoi(t, tr.waitLine(`checkpoint \S* ?\(shutdown\) at step (\d+)`, time.Minute)[1])
	tr.waitLine(`stopping at step`, time.Minute)
	if code := tr.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("trainer exit code %d, want %d", code, exitInterrupted)
	}
	st, err := file.New(store)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := checkpoint.ReadLatest(context.Background(), st); err != nil || int(l.Step) != shutdown {
		t.Fatalf("latest=%+v err=%v, want step %d committed", l, err, shutdown)
	}

	// The container restarts in place: same sidecar, new trainer process.
	tr2 := trainerProc(t, env, "--steps", "2000", "--step-time", "0.01")
	r := tr2.waitLine(`resuming from step (\d+) \((.*)\)`, time.Minute)
	if got := atoi(t, r[1]); got != shutdown {
		t.Fatalf("the restarted trainer resumed from step %d, want %d (the committed one)", got, shutdown)
	}
	if rel, err := filepath.Rel(filepath.Join(dir, "ckpt"), r[2]); err != nil || filepath.Base(filepath.Dir(r[2])) != "restore" {
		t.Fatalf("resume dir %s (%s, %v) is not in the sidecar's restore area", r[2], rel, err)
	}
	agent.waitLine(`a trainer is back after a commit`, time.Minute)

	// The spot notice: the restarted trainer's interruption checkpoint,
	// some 50 steps on (train.py prints every 25th step).
	tr2.waitLine(`^step `+strconv.Itoa((shutdown+50+24)/25*25)+` `, time.Minute)
	imds.Notice()
	m := tr2.waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	tr2.waitLine(`stopping at step`, time.Minute)
	if code := tr2.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("trainer exit code %d, want %d", code, exitInterrupted)
	}
	agent.waitLine(`interruption checkpoint committed`, time.Minute)
	if got := testutil.Scrape(t, maddr, "spotagent_last_committed_step"); int(got) != step {
		t.Fatalf("spotagent_last_committed_step=%v, want %d", got, step)
	}
	// The journal is written after the commit: the goodput gauge follows it.
	testutil.WaitWithin(t, "spotagent_goodput_ratio in (0, 1]", 30*time.Second, func() bool {
		g := testutil.Scrape(t, maddr, "spotagent_goodput_ratio")
		return g > 0 && g <= 1
	})
	if got := testutil.Scrape(t, maddr, `spotagent_notices_total{cloud="aws",kind="termination"}`); got != 1 {
		t.Fatalf("notices_total=%v, want 1", got)
	}
	// The sidecar outlives the notice (a trainer that connects late is
	// told to stop) until the kubelet's SIGTERM.
	agent.signal(syscall.SIGTERM)
	if code := agent.wait(time.Minute); code != 0 {
		t.Fatalf("sidecar exit code %d", code)
	}

	// The pod comes back on another node: the sidecar restores, the
	// trainer resumes and finishes.
	imds2 := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds2.Close)
	args[len(args)-5] = imds2.URL()
	agent2 := start(t, nil, args...)
	agent2.waitLine(`socket listening`, time.Minute)
	tr3 := trainerProc(t, env, "--steps", strconv.Itoa(step+100), "--step-time", "0.001")
	r = tr3.waitLine(`resuming from step (\d+)`, time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from %d, want %d", got, step)
	}
	if code := tr3.wait(time.Minute); code != 0 {
		t.Fatalf("resumed trainer exit code %d\n%s", code, tr3.output())
	}
	agent2.signal(syscall.SIGTERM)
	if code := agent2.wait(time.Minute); code != 0 {
		t.Fatalf("second sidecar exit code %d", code)
	}
}

// TestNode: one agent for the machine; trainers of two runs connect, each
// writes only to prefix/<its run id>; one notice reaches both; a run id that
// tries to leave the prefix is refused.
func TestNode(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	imds := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds.Close)
	sock := filepath.Join(dir, "agent.sock")
	prefix := filepath.Join(dir, "runs")
	agent := start(t, nil, "node", "--store-prefix", "file://"+prefix, "--checkpoint-root", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--interval", "1h", "--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", "100ms")
	agent.waitLine(`socket listening`, time.Minute)

	// A hostile run id is refused with an error reply, and nothing is created.
	c, err := protocol.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_, err = c.Hello(ctx, protocol.Message{PID: 1, RunID: "../other"})
	cancel()
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("hello with run_id ../other: %v, want an error reply", err)
	}
	c.Close()
	if _, err := os.Stat(filepath.Join(dir, "other")); err == nil {
		t.Fatal("a store outside the prefix was created")
	}

	var trainers []*proc
	for _, run := range []string{"alpha", "beta"} {
		tr := trainerProc(t, []string{"SPOTAGENT_SOCKET=" + sock, "SPOTAGENT_RUN_ID=" + run}, "--steps", "400", "--step-time", "0.01")
		tr.waitLine(`starting fresh`, time.Minute)
		trainers = append(trainers, tr)
	}
	for _, tr := range trainers {
		tr.waitLine(`^step 50 `, time.Minute)
	}
	imds.Notice()
	steps := map[string]int{}
	for i, run := range []string{"alpha", "beta"} {
		m := trainers[i].waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
		steps[run] = atoi(t, m[1])
		trainers[i].waitLine(`stopping at step`, time.Minute)
		if code := trainers[i].wait(time.Minute); code != exitInterrupted {
			t.Fatalf("%s exit code %d, want %d", run, code, exitInterrupted)
		}
	}
	for run, step := range steps {
		st, err := file.New(filepath.Join(prefix, run))
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitWithin(t, "run "+run+" committed at its interruption step", time.Minute, func() bool {
			l, err := checkpoint.ReadLatest(context.Background(), st)
			return err == nil && int(l.Step) == step
		})
		var m checkpoint.Manifest
		l, _ := checkpoint.ReadLatest(context.Background(), st)
		b, _ := os.ReadFile(filepath.Join(prefix, run, l.Manifest))
		json.Unmarshal(b, &m)
		if m.RunID != run {
			t.Fatalf("manifest run_id=%q, want %q", m.RunID, run)
		}
	}
	agent.signal(syscall.SIGTERM)
	if code := agent.wait(time.Minute); code != 0 {
		t.Fatalf("node exit code %d", code)
	}
}
