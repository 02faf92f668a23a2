package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// freeAddr returns a loopback address nobody listens on yet.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape reads one metric's value from /metrics.
func scrape(t *testing.T, addr, metric string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("metric %s not in /metrics", metric)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
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

// TestSidecar: the agent without a child, a trainer in another process on
// the shared socket, an AWS spot notice; metrics and health on the side.
func TestSidecar(t *testing.T) {
	parallel(t)
	requirePython(t, false)
	dir := testutil.ShortDir(t)
	imds := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds.Close)
	sock := filepath.Join(dir, "run", "agent.sock")
	maddr := freeAddr(t)
	args := []string{"sidecar", "--store", "file://" + filepath.Join(dir, "store"), "--run-id", "pod",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", sock, "--interval", "1h",
		"--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", "100ms", "--metrics-addr", maddr}
	agent := start(t, nil, args...)
	agent.waitLine(`socket listening`, time.Minute)
	// Ready follows the socket by a moment: wait for it, bounded.
	testutil.WaitWithin(t, "/readyz 200", 30*time.Second, func() bool { return httpStatus(t, "http://"+maddr+"/readyz") == 200 })
	env := []string{"SPOTAGENT_SOCKET=" + sock}
	tr := trainerProc(t, env, "--steps", "400", "--step-time", "0.01")
	tr.waitLine(`^step 50 `, time.Minute)
	imds.Notice()
	m := tr.waitLine(`checkpoint \S+ \(interruption\) at step (\d+)`, time.Minute)
	step := atoi(t, m[1])
	tr.waitLine(`stopping at step`, time.Minute)
	if code := tr.wait(time.Minute); code != exitInterrupted {
		t.Fatalf("trainer exit code %d, want %d", code, exitInterrupted)
	}
	agent.waitLine(`interruption checkpoint committed`, time.Minute)
	if got := scrape(t, maddr, "spotagent_last_committed_step"); int(got) != step {
		t.Fatalf("spotagent_last_committed_step=%v, want %d", got, step)
	}
	// The journal is written after the commit: the goodput gauge follows it.
	testutil.WaitWithin(t, "spotagent_goodput_ratio in (0, 1]", 30*time.Second, func() bool {
		g := scrape(t, maddr, "spotagent_goodput_ratio")
		return g > 0 && g <= 1
	})
	if got := scrape(t, maddr, `spotagent_notices_total{cloud="aws",kind="termination"}`); got != 1 {
		t.Fatalf("notices_total=%v, want 1", got)
	}
	// The sidecar outlives the notice (a trainer that connects late is
	// told to stop) until the kubelet's SIGTERM.
	agent.signal(syscall.SIGTERM)
	if code := agent.wait(time.Minute); code != 0 {
		t.Fatalf("sidecar exit code %d", code)
	}

	// The pod comes back on another node: the sidecar restores, the trainer resumes.
	imds2 := fake.NewAWS(fake.AWSOptions{})
	t.Cleanup(imds2.Close)
	args[len(args)-5] = imds2.URL()
	agent2 := start(t, nil, args...)
	agent2.waitLine(`socket listening`, time.Minute)
	tr2 := trainerProc(t, env, "--steps", "100", "--step-time", "0.001")
	r := tr2.waitLine(`resuming from step (\d+)`, time.Minute)
	if got := atoi(t, r[1]); got != step {
		t.Fatalf("resumed from %d, want %d", got, step)
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
