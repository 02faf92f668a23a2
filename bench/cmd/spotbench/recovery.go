package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// benchRecovery (issue 51 item 3): a whole recovery timed end to end. A job
// of 2 nodes × 2 ranks (`spotagent run --node-rank K` around the real
// torchrun, bench/recovery_trainer.py: DDP, gloo, a file store, a peer tier
// with --replicas 1) meets one of three events; the bench then restarts
// every node's agent itself, as a JobSet would, after the modelled restart
// delay, and times the event → every rank's first resumed step, broken down
// (recovery_run.go has the cases and the arithmetic).
func benchRecovery(c *config, r *report.Report) error {
	ver, err := exec.Command(proc.TorchPython(), "-c", "import torch; print(torch.__version__)").Output()
	if err != nil {
		return fmt.Errorf("%s has no torch (scripts/test-deps.sh installs python3-torch): %w", proc.TorchPython(), err)
	}
	python := fmt.Sprintf("%s, torch %s", proc.TorchPython(), strings.TrimSpace(string(ver)))
	runs := map[string][]recoveryRun{}
	for rep := range c.recoveryReps {
		for _, cs := range recoveryCases {
			var x recoveryRun
			var err error
			for try := 0; try < 2; try++ { // a rendezvous port taken meanwhile by another process: a new one
				if x, err = oneRecovery(c, cs, rep); err == nil {
					break
				}
				logf("recovery %s, run %d: %v; again", cs.name, rep, err)
			}
			if err != nil {
				return fmt.Errorf("recovery %s, run %d: %w", cs.name, rep, err)
			}
			logf("recovery %s %d: event → first resumed step %.2fs (detect %.2f, exit %.2f, restart %.2f, restore %.2f, boot %.2f; local %d MiB, peer %d MiB, store %d MiB; load %.2f)",
				cs.name, rep, x.Total, x.Detect, x.Exit, x.Delay, x.Restore, x.Boot, x.Local>>20, x.Peer>>20, x.Store>>20, x.Load)
			runs[cs.name] = append(runs[cs.name], x)
		}
	}
	r.Add("Recovery, end to end: event → every rank's first resumed step (issue 51)", recoveryReport(runs, c.recoveryMiB, c.recoveryDelay, python))
	r.Command("spotbench -only recovery [-recovery-reps 3] [-recovery-mib 128] [-recovery-restart-delay 2s]   # scripts/bench.sh: SPOTBENCH_ONLY=recovery make bench")
	return nil
}

// recoveryNode is one node's `spotagent run` and what its output said.
type recoveryNode struct {
	k       int
	cmd     *exec.Cmd
	imds    *fake.AWS
	start   time.Time
	done    chan struct{}
	exitAt  time.Time // set before done closes
	mu      sync.Mutex
	changed chan struct{}           // closed and replaced at every line
	first   map[string]proc.LogLine // each message's first line
	trainer int                     // torchrun's pid ("trainer started")
	ranks   []int                   // the ranks' pids ("trainer connected")
	steps   map[int]recoveryStep    // rank → its first resumed step's line
	trained map[int]bool            // rank → took a step
}

// startRecoveryNode starts node k's agent on dir with the job's torchrun
// on port; interval is its --interval.
func startRecoveryNode(c *config, work string, k int, dir string, port int, interval string, perRank int64) (*recoveryNode, error) {
	imds, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(work, fmt.Sprintf("n%d.sock", k))
	os.Remove(sock) // a killed agent's
	args := []string{"run", "--store", "file://" + filepath.Join(work, "store"), "--run-id", "recovery", "--node-rank", strconv.Itoa(k),
		"--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", c.pollInterval.String(), "--interval", interval,
		"--checkpoint-dir", dir, "--socket", sock, "--log-format", "json",
		"--peer-restore", "--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1", "--replicas", "1",
		"--", proc.TorchPython(), "python/examples/torchrun.py", "--nnodes", "2", "--node_rank", strconv.Itoa(k),
		"--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port), "--monitor_interval", "1",
		"bench/recovery_trainer.py"}
	cmd := exec.Command(c.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a whole: the agent's group and its trainer's
	cmd.Env = append(os.Environ(), "SAVE_BYTES="+strconv.FormatInt(perRank, 10), "STEP_SLEEP_MS=20", "PYTHONUNBUFFERED=1")
	pr, pw, err := os.Pipe() // not cmd's pipes: Wait returns at the agent's exit, whoever still holds the pipe
	if err != nil {
		imds.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	logFile, err := os.Create(filepath.Join(work, fmt.Sprintf("agent-%d-%d.log", k, time.Now().UnixNano())))
	if err != nil {
		imds.Close()
		return nil, err
	}
	n := &recoveryNode{k: k, cmd: cmd, imds: imds, done: make(chan struct{}), changed: make(chan struct{}),
		first: map[string]proc.LogLine{}, steps: map[int]recoveryStep{}, trained: map[int]bool{}}
	n.start = time.Now()
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		imds.Close()
		return nil, err
	}
	pw.Close()
	lines := proc.ReadLines(pr, logFile, 1024)
	go func() {
		cmd.Wait()
		n.mu.Lock()
		n.exitAt = time.Now()
		n.mu.Unlock()
		close(n.done)
	}()
	go func() {
		defer logFile.Close()
		for l := range lines {
			n.note(l)
		}
	}()
	return n, nil
}

// note records what line l says.
func (n *recoveryNode) note(l proc.LogLine) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := l.Msg(); m != "" {
		if _, ok := n.first[m]; !ok {
			n.first[m] = l
		}
		pid, _ := l.Raw["pid"].(float64)
		switch m {
		case "trainer started":
			n.trainer = int(pid)
		case "trainer connected":
			n.ranks = append(n.ranks, int(pid))
		}
	}
	if s, ok := parseRecoveryLine(l.Text); ok {
		if s.Training {
			n.trained[s.Rank] = true
		} else if _, seen := n.steps[s.Rank]; !seen {
			n.steps[s.Rank] = s
		}
	}
	close(n.changed)
	n.changed = make(chan struct{})
}

// wait returns once cond (called with n.mu held) holds, or fails after
// timeout or when the agent's output has ended without it.
func (n *recoveryNode) wait(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.After(timeout)
	for {
		n.mu.Lock()
		ok, ch := cond(), n.changed
		n.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-n.done:
			n.mu.Lock()
			ok = cond()
			n.mu.Unlock()
			if ok {
				return nil
			}
			// Its last lines may still be in the pipe (a torchrun child holds it): a moment more.
			select {
			case <-ch:
				continue
			case <-time.After(2 * time.Second):
			}
			return fmt.Errorf("node %d's agent exited (%v) before %s", n.k, n.cmd.ProcessState, what)
		case <-deadline:
			return fmt.Errorf("node %d: no %s within %v", n.k, what, timeout)
		}
	}
}

// msg waits for the first line of message m and returns it.
func (n *recoveryNode) msg(timeout time.Duration, m string) (proc.LogLine, error) {
	var l proc.LogLine
	err := n.wait(timeout, strconv.Quote(m), func() bool {
		var ok bool
		l, ok = n.first[m]
		return ok
	})
	return l, err
}

// kill takes node n's machine away: SIGKILL of the agent's group, its
// torchrun's group and every rank it saw.
func (n *recoveryNode) kill() {
	n.mu.Lock()
	pids := append([]int{n.trainer}, n.ranks...)
	n.mu.Unlock()
	syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	for _, p := range pids {
		if p > 0 {
			syscall.Kill(-p, syscall.SIGKILL)
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// reap kills what is left of n and waits for its agent.
func (n *recoveryNode) reap() {
	n.kill()
	<-n.done
	n.imds.Close()
}

func freeRecoveryPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// loadAvg1 is the machine's 1-minute load average (0 when unreadable).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	x, _ := strconv.ParseFloat(f[0], 64)
	return x
}

// oneRecovery runs case cs once: a fresh job, the event, the exits, the
// modelled restart delay, the restart, every rank's first resumed step.
func oneRecovery(c *config, cs recoveryCase, rep int) (recoveryRun, error) {
	var x recoveryRun
	work := filepath.Join(c.work, fmt.Sprintf("recovery-%s-%d", cs.name, rep))
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return x, err
	}
	if os.Getenv("SPOTBENCH_KEEP_WORK") == "" {
		defer os.RemoveAll(work)
	}
	perRank := int64(c.recoveryMiB) << 20 / 2
	var nodes []*recoveryNode
	defer func() {
		for _, n := range nodes {
			n.reap()
		}
	}()
	port, err := freeRecoveryPort()
	if err != nil {
		return x, err
	}
	interval := "1h"
	if cs.periodic {
		interval = "8s" // the checkpoint the lost node's job restores
	}
	dirs := []string{filepath.Join(work, "n0"), filepath.Join(work, "n1")}
	for k := range 2 {
		n, err := startRecoveryNode(c, work, k, dirs[k], port, interval, perRank)
		if err != nil {
			return x, err
		}
		nodes = append(nodes, n)
	}
	const long = 5 * time.Minute
	for _, n := range nodes {
		if err := n.wait(long, "every rank training", func() bool { return len(n.trained) == 2 }); err != nil {
			return x, err
		}
	}
	if cs.periodic { // a committed checkpoint, kept locally and by the other node
		for _, n := range nodes {
			for _, m := range []string{"checkpoint committed", "kept a local copy of the committed checkpoint",
				"kept a copy of another node's part of the committed checkpoint"} {
				if _, err := n.msg(long, m); err != nil {
					return x, err
				}
			}
		}
	} else {
		time.Sleep(2 * time.Second) // DDP warm, steps running
	}
	x.Load = loadAvg1()
	var m recoveryMarks
	switch cs.name {
	case "notice":
		m.Event = nodes[1].imds.Terminate("terminate", time.Now().Add(2*time.Minute).Truncate(time.Second))
	case "lost":
		m.Event = time.Now()
		nodes[1].kill()
	case "restart":
		m.Event = time.Now()
		nodes[1].cmd.Process.Signal(syscall.SIGTERM)
	}
	survivors := nodes
	if cs.name == "lost" {
		survivors = nodes[:1]
		l, err := firstOf(nodes[0], long, "a rank of this node ended on an error",
			"a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks")
		if err != nil {
			return x, err
		}
		m.Detect = l.At
	} else {
		l, err := nodes[1].msg(long, "checkpoint requested")
		if err != nil {
			return x, err
		}
		m.Detect = l.At
		for _, n := range nodes {
			l, err := n.msg(long, "checkpoint committed")
			if err != nil {
				return x, err
			}
			m.Commit = later(m.Commit, l.At)
		}
	}
	for _, n := range survivors {
		select {
		case <-n.done:
		case <-time.After(long):
			return x, fmt.Errorf("node %d's agent still runs %v after the event", n.k, long)
		}
		m.Exited = later(m.Exited, n.exitAt)
		x.Codes = append(x.Codes, n.cmd.ProcessState.ExitCode())
	}
	for _, n := range nodes {
		n.reap() // what is left of them (the lost node's ranks)
	}
	nodes = nil
	// The orchestrator: the modelled delay from the last exit, then every
	// node at once; a lost or reclaimed machine comes back empty.
	time.Sleep(time.Until(m.Exited.Add(c.recoveryDelay)))
	if port, err = freeRecoveryPort(); err != nil {
		return x, err
	}
	if cs.newMachine {
		dirs[1] = filepath.Join(work, "n1-new")
	}
	m.Restart = time.Now()
	for k := range 2 {
		n, err := startRecoveryNode(c, work, k, dirs[k], port, "1h", perRank)
		if err != nil {
			return x, err
		}
		nodes = append(nodes, n)
	}
	var restored []proc.LogLine
	for _, n := range nodes {
		l, err := n.msg(long, "restored checkpoint")
		if err != nil {
			return x, err
		}
		restored = append(restored, l)
		if err := n.wait(long, "every rank's first resumed step", func() bool { return len(n.steps) == 2 }); err != nil {
			return x, err
		}
		n.mu.Lock()
		for _, s := range n.steps {
			m.Steps = append(m.Steps, s)
		}
		n.mu.Unlock()
	}
	return recoveryFrom(cs, m, restored, c.recoveryDelay, x)
}

// firstOf waits for the first line of any of msgs on n.
func firstOf(n *recoveryNode, timeout time.Duration, msgs ...string) (proc.LogLine, error) {
	var l proc.LogLine
	err := n.wait(timeout, strings.Join(msgs, " or "), func() bool {
		for _, m := range msgs {
			if x, ok := n.first[m]; ok && (l.Raw == nil || x.At.Before(l.At)) {
				l = x
			}
		}
		return l.Raw != nil
	})
	return l, err
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
