package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata/fake"

	"github.com/spotagent/spotagent/bench/internal/benchstore"
	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// benchDistributed (issue 15): a job of 2 nodes × 2 ranks on this machine,
// one `spotagent run --node-rank K` per node around the real torchrun
// (python/examples/torchrun.py: torchrun on Debian's torch 1.13), ranks
// running python/examples/train_ddp.py (DDP, gloo) with SAVE_BYTES of
// payload per rank, one MinIO store; a spot notice on node 1 only;
// measured: notice exposed → the later of the two agents' "checkpoint
// committed" (the job-wide commit). Next to it, the single-node figure:
// one agent, 2 ranks, same bytes per rank, no --node-rank. Then the
// client's collective cost per poll (bench/collective_cost.py).
func benchDistributed(c *config, r *report.Report, s *benchstore.Stores) error {
	const perRank = 256 << 20
	var b strings.Builder
	fmt.Fprintf(&b, "`spotagent run` per node around the real torchrun (`python/examples/torchrun.py`: torch 1.13's elastic agent, static rendezvous on loopback), ranks running `python/examples/train_ddp.py` (DDP, gloo, CPU) with a %d MiB random payload per rank in each checkpoint (written and fsynced by the rank), MinIO; an AWS spot notice on node 1 only (`--poll-interval 1s`, `spot/instance-action` read every 250 ms); measured: notice exposed → the last agent's \"checkpoint committed\" (for the job: every node's part durable, manifest and latest.json written). %d runs per cell, medians (min–max). All nodes share this machine's 2 cores, its disk and one MinIO: 2 × 2 moves twice the bytes of 1 × 2 through the same machine, so compare it with 1 × 4.\n\n", perRank>>20, c.e2eReps)
	b.WriteString("| job | checkpoint | notice → committed s | notice → request ms |\n| --- | --- | --- | --- |\n")
	for _, shape := range []struct {
		label        string
		nodes, ranks int
	}{{"1 node × 2 ranks (single-node path)", 1, 2}, {"1 node × 4 ranks (single-node path, same bytes as 2 × 2)", 1, 4},
		{"2 nodes × 2 ranks (parts)", 2, 2}} {
		var tot, req []float64
		for rep := range c.e2eReps {
			uri := fmt.Sprintf("s3://%s/dist-%d-%d-%d", benchstore.Bucket, shape.nodes, shape.ranks, rep)
			t, q, err := oneDistributed(c, s.MinIO.Env(), uri, shape.nodes, shape.ranks, perRank)
			if err != nil {
				return fmt.Errorf("distributed %s: %w", shape.label, err)
			}
			logf("%s: notice→committed %.2fs (request %.0f ms)", shape.label, t.Seconds(), stats.MS(q))
			tot, req = append(tot, t.Seconds()), append(req, stats.MS(q))
			if err := benchstore.DeletePrefix(s.MinIO.Env(), uri); err != nil {
				logf("cleanup %s: %v", uri, err)
			}
			s.EmptyTrash()
		}
		lo, hi := stats.MinMax(tot)
		fmt.Fprintf(&b, "| %s | %d MiB | %.2f (%.2f–%.2f) | %.0f |\n", shape.label, shape.nodes*shape.ranks*perRank>>20, stats.Median(tot), lo, hi, stats.Median(req))
	}
	out, err := exec.Command(proc.TorchPython(), "bench/collective_cost.py").Output()
	if err != nil {
		return fmt.Errorf("bench/collective_cost.py: %w", err)
	}
	b.WriteString("\nThe agreement's cost per `poll` (one `all_reduce(MAX)` of two int64 over gloo, local processes, no agent), from `bench/collective_cost.py`:\n\n")
	b.Write(out)
	r.Add("8. Multi-node: notice → job-wide commit, and the agreement's cost", b.String())
	r.Command("spotagent run --store URI --run-id dist --node-rank K --cloud aws --aws-imds-endpoint http://127.0.0.1:PORT --poll-interval 1s --interval 1h --log-format json -- python3 python/examples/torchrun.py --nnodes 2 --node_rank K --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT python/examples/train_ddp.py")
	return nil
}

// oneDistributed runs one job of nodes × ranks, exposes a notice on the
// last node once every rank trains, and returns notice → the last commit
// and notice → that node's request.
func oneDistributed(c *config, env []string, uri string, nodes, ranks int, perRank int64) (time.Duration, time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	type agent struct {
		cmd   *exec.Cmd
		lines <-chan proc.LogLine
		imds  *fake.AWS
		done  chan struct{}
	}
	var agents []*agent
	defer func() {
		for _, a := range agents {
			a.cmd.Process.Signal(syscall.SIGKILL)
			<-a.done
			a.imds.Close()
		}
	}()
	for k := range nodes {
		imds, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
		if err != nil {
			return 0, 0, err
		}
		dir := filepath.Join(c.work, fmt.Sprintf("dist-n%d", k))
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return 0, 0, err
		}
		args := []string{"run", "--store", uri, "--run-id", "dist", "--cloud", "aws", "--aws-imds-endpoint", imds.URL(),
			"--poll-interval", c.pollInterval.String(), "--interval", "1h", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
			"--socket", filepath.Join(dir, "agent.sock"), "--log-format", "json"}
		if nodes > 1 {
			args = append(args, "--node-rank", strconv.Itoa(k))
		}
		args = append(args, "--", proc.TorchPython(), "python/examples/torchrun.py", "--nnodes", strconv.Itoa(nodes),
			"--node_rank", strconv.Itoa(k), "--nproc_per_node", strconv.Itoa(ranks),
			"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port), "python/examples/train_ddp.py")
		cmd := exec.Command(c.bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, "TOTAL_STEPS=100000000", "STEP_SLEEP_MS=10", "SAVE_BYTES="+strconv.FormatInt(perRank, 10))
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return 0, 0, err
		}
		logFile, _ := os.Create(filepath.Join(c.work, fmt.Sprintf("dist-n%d.log", k)))
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			return 0, 0, err
		}
		a := &agent{cmd: cmd, lines: proc.ReadLines(stderr, logFile, 256), imds: imds, done: make(chan struct{})}
		go func() { cmd.Wait(); close(a.done) }()
		agents = append(agents, a)
	}
	timeout := time.After(5 * time.Minute)
	wait := func(a *agent, msg string, n int) (proc.LogLine, error) {
		seen := 0
		for {
			select {
			case l, ok := <-a.lines:
				if !ok {
					return proc.LogLine{}, fmt.Errorf("agent exited before %q", msg)
				}
				if l.Msg() == msg {
					if seen++; seen == n {
						return l, nil
					}
				}
			case <-timeout:
				return proc.LogLine{}, fmt.Errorf("timed out waiting for %q", msg)
			}
		}
	}
	for _, a := range agents {
		if _, err := wait(a, "trainer connected", ranks); err != nil {
			return 0, 0, err
		}
	}
	time.Sleep(3*time.Second + time.Duration(time.Now().UnixNano()%int64(c.pollInterval))) // DDP set up, training
	last := agents[len(agents)-1]
	exposed := last.imds.Terminate("terminate", time.Now().Add(2*time.Minute).Truncate(time.Second))
	reqLine, err := wait(last, "checkpoint requested", 1)
	if err != nil {
		return 0, 0, err
	}
	var end time.Time
	for _, a := range agents {
		com, err := wait(a, "checkpoint committed", 1)
		if err != nil {
			return 0, 0, err
		}
		if com.At.After(end) {
			end = com.At
		}
	}
	for _, a := range agents {
		go func() {
			for range a.lines {
			}
		}()
	}
	return end.Sub(exposed), reqLine.At.Sub(exposed), nil
}
