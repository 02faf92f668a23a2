package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/liveness"
)

// benchDetect (issue 51 item 1): a node that stops answering, found by the
// agents' heartbeats (pkg/liveness), against the blips that must be
// forgiven.
//
//   - silent: a 2 nodes × 2 ranks job (`spotagent run --node-rank K`
//     around the real torchrun, train_ddp.py, gloo, a file store), node 1's
//     whole tree (agent, torchrun, ranks) SIGSTOPped once every rank
//     trains: stop → node 0's agent exits 75, split at its verdict.
//   - blips: pairs of bare monitors (`spotbench detect-node`: liveness.Start,
//     what the agent runs) with the agent's settings, node 0 of each pair in
//     one network namespace and node 1 in another, joined by a veth pair
//     (needs root and nft; without them, the loopback and no loss): every
//     node 1 SIGSTOPped for 1 s, 10 rounds; 100 % loss for 1 s both ways,
//     10 rounds; then 5 % loss both ways for -detect-loss (nftables: this
//     kernel has no netem). Any verdict is a false alarm.
//   - cost: N monitors in one process (`spotbench detect-ring`) on the
//     loopback: CPU and peak RSS per node at N.
func benchDetect(c *config, r *report.Report) error {
	var silent, blips, cost strings.Builder
	if err := detectBlips(c, r, &blips); err != nil {
		return err
	}
	if err := detectCost(c, &cost); err != nil {
		return err
	}
	if err := detectSilent(c, r, &silent); err != nil {
		return err
	}
	b := silent.String() + blips.String() + cost.String()
	r.Add("Silent node detection: 3 s, blips forgiven (issue 51)", b)
	r.Command("spotbench -only detect [-detect-reps 3] [-detect-pairs 10] [-detect-loss 60s] [-detect-timeouts 1.2s,2s] [-detect-ring 1000]   # root: ip netns, nft")
	return nil
}

// detectSilent runs the silent-node case c.detectReps times.
func detectSilent(c *config, r *report.Report, b *strings.Builder) error {
	var total, verdict, exit []float64
	codes := map[int]int{}
	for rep := range c.detectReps {
		t, v, code, err := oneSilent(c, rep)
		for try := 1; err != nil && try < 3; try++ { // a rendezvous port taken meanwhile by another process: a new one
			logf("silent node %d: %v; again", rep, err)
			t, v, code, err = oneSilent(c, rep)
		}
		if err != nil {
			return fmt.Errorf("silent node, run %d: %w", rep, err)
		}
		logf("silent node %d: stop → node 0's verdict %.2fs, → its exit %.2fs (code %d)", rep, v.Seconds(), t.Seconds(), code)
		codes[code]++
		total, verdict, exit = append(total, t.Seconds()), append(verdict, v.Seconds()), append(exit, (t-v).Seconds())
	}
	lo, hi := stats.MinMax(total)
	var cs []string
	for code, n := range codes {
		cs = append(cs, fmt.Sprintf("%d × %d", code, n))
	}
	codeList := strings.Join(cs, ", ")
	fmt.Fprintf(b, "**Silent node.** 2 nodes × 2 ranks, `spotagent run --node-rank K --cloud none` around the real torchrun (`python/examples/torchrun.py`, torch 1.13, gloo, `train_ddp.py`), default `--peer-timeout` (%v, a heartbeat every %v), a file store; node 1's agent, torchrun and ranks SIGSTOPped (no RST) once every rank trains; %d runs, medians (min–max):\n\n", liveness.DefaultTimeout, liveness.DefaultInterval, c.detectReps)
	b.WriteString("| stop → node 0's verdict s | verdict → node 0's agent exits s | stop → exit s | exit codes |\n| --- | --- | --- | --- |\n")
	fmt.Fprintf(b, "| %.2f | %.2f | **%.2f** (%.2f–%.2f) | %s |\n\n", stats.Median(verdict), stats.Median(exit), stats.Median(total), lo, hi, codeList)
	med := stats.Median(total)
	r.Target(report.Target{Name: "silent node → survivors exit 75 (2 × 2, torchrun)", Want: "median ≤ 3 s, every exit 75",
		Got: fmt.Sprintf("%.2f s (%.2f–%.2f), codes %s", med, lo, hi, codeList), Met: med <= 3 && codes[75] == len(total),
		Margin: fmt.Sprintf("%+.2f s", 3-med)})
	return nil
}

// oneSilent: one job, node 1 stopped; stop → node 0's exit, stop → its
// verdict, its exit code.
func oneSilent(c *config, rep int) (time.Duration, time.Duration, int, error) {
	work := filepath.Join(c.work, fmt.Sprintf("detect-%d", rep))
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return 0, 0, 0, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	type agent struct {
		cmd   *exec.Cmd
		lines <-chan proc.LogLine
		done  chan struct{}
		seen  map[string]int // messages read so far
	}
	var agents []*agent
	defer func() {
		for _, a := range agents {
			syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL) // its own group (Setpgid); its trainer's is killed by its guard
			<-a.done
		}
	}()
	for k := range 2 {
		dir := filepath.Join(work, fmt.Sprintf("n%d", k))
		args := []string{"run", "--store", "file://" + filepath.Join(work, "store"), "--run-id", "detect", "--cloud", "none",
			"--interval", "1h", "--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(work, fmt.Sprintf("n%d.sock", k)),
			"--log-format", "json", "--node-rank", strconv.Itoa(k),
			"--", proc.TorchPython(), "python/examples/torchrun.py", "--nnodes", "2", "--node_rank", strconv.Itoa(k),
			"--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port), "python/examples/train_ddp.py"}
		cmd := exec.Command(c.bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // stopped as a whole: the agent's group and its trainer's
		cmd.Env = append(os.Environ(), "TOTAL_STEPS=100000000", "STEP_SLEEP_MS=20", "SAVE_BYTES=1048576")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return 0, 0, 0, err
		}
		logFile, _ := os.Create(filepath.Join(work, fmt.Sprintf("agent-%d.log", k)))
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			return 0, 0, 0, err
		}
		a := &agent{cmd: cmd, lines: proc.ReadLines(stderr, logFile, 1024), done: make(chan struct{}), seen: map[string]int{}}
		go func() { cmd.Wait(); close(a.done) }()
		agents = append(agents, a)
	}
	timeout := time.After(5 * time.Minute)
	trainer := 0
	// wait returns once a has logged msg n times, whatever it logged
	// meanwhile (the order of a start's messages varies).
	wait := func(a *agent, msg string, n int) (proc.LogLine, error) {
		for a.seen[msg] < n {
			select {
			case l, ok := <-a.lines:
				if !ok {
					return proc.LogLine{}, fmt.Errorf("agent exited before %q", msg)
				}
				if l.Msg() == "trainer started" && a == agents[1] {
					if pid, ok := l.Raw["pid"].(float64); ok {
						trainer = int(pid)
					}
				}
				if a.seen[l.Msg()]++; l.Msg() == msg && a.seen[msg] == n {
					return l, nil
				}
			case <-timeout:
				return proc.LogLine{}, fmt.Errorf("timed out waiting for %q", msg)
			}
		}
		return proc.LogLine{}, nil
	}
	for _, a := range agents {
		if _, err := wait(a, "liveness: a neighbour heard", 1); err != nil {
			return 0, 0, 0, err
		}
	}
	for _, a := range agents {
		if _, err := wait(a, "trainer connected", 2); err != nil {
			return 0, 0, 0, err
		}
	}
	if trainer <= 0 {
		return 0, 0, 0, fmt.Errorf("node 1's trainer pid not logged")
	}
	time.Sleep(3 * time.Second) // DDP set up, training
	stop := time.Now()
	signalTree(agents[1].cmd.Process.Pid, syscall.SIGSTOP) // torch 2.x's ranks are in sessions of their own: outside both groups
	syscall.Kill(-agents[1].cmd.Process.Pid, syscall.SIGSTOP)
	syscall.Kill(-trainer, syscall.SIGSTOP)
	v, err := wait(agents[0], "a neighbour node's agent is silent (its machine stopped answering): ending this node's ranks", 1)
	if err != nil {
		return 0, 0, 0, err
	}
	go func() {
		for range agents[0].lines {
		}
	}()
	select {
	case <-agents[0].done:
	case <-time.After(2 * time.Minute):
		return 0, 0, 0, fmt.Errorf("node 0's agent still runs 2 min after its verdict")
	}
	took := time.Since(stop)
	signalTree(agents[1].cmd.Process.Pid, syscall.SIGKILL) // its stopped tree, ranks outside its groups included
	syscall.Kill(-trainer, syscall.SIGKILL)
	go func() {
		for range agents[1].lines {
		}
	}()
	return took, v.At.Sub(stop), agents[0].cmd.ProcessState.ExitCode(), nil
}

// signalTree sends sig to pid and every process below it (child.Tree),
// reading /proc again until no new one appears.
func signalTree(pid int, sig syscall.Signal) {
	stopped := map[int]bool{}
	for grew := true; grew; {
		grew = false
		for _, p := range child.Tree(pid) {
			if !stopped[p] {
				syscall.Kill(p, sig)
				stopped[p], grew = true, true
			}
		}
	}
}

// detectBlips runs the false-alarm trials at each of c.detectTimeouts.
func detectBlips(c *config, r *report.Report, b *strings.Builder) error {
	ns := os.Geteuid() == 0
	if _, err := exec.LookPath("nft"); err != nil {
		ns = false
	}
	where := "two network namespaces joined by a veth pair (loss by nftables `numgen random` on each side's output: this kernel has no netem)"
	if !ns {
		where = "the loopback (not root, or no `nft`: no namespaces; the loss rows are skipped)"
	}
	fmt.Fprintf(b, "**Blips forgiven.** %d pairs of monitors (`spotbench detect-node`: `liveness.Start`, what the agent runs, a heartbeat every %v), %s. Any verdict on either side is a false alarm. The pause: every node 1 SIGSTOPped for 1.0 s then 2.5 s left for a late verdict, 10 rounds; the burst: 100 %% loss both ways for 1.0 s, 10 rounds; then 5 %% loss both ways for %v.\n\n", c.detectPairs, liveness.DefaultInterval, where, c.detectLoss)
	b.WriteString("| timeout | 1 s SIGSTOP of a node: false alarms / pauses | 1 s 100 % loss burst: false alarms / bursts | 5 % loss: false alarms / heartbeats sent |\n| --- | --- | --- | --- |\n")
	for _, to := range c.detectTimeouts {
		res, err := blipTrials(c, to, ns)
		if err != nil {
			return fmt.Errorf("blips at timeout %v: %w", to, err)
		}
		logf("timeout %v: pauses %d/%d, bursts %d/%d, 5%% loss %d/%d heartbeats", to, res.pauseFalse, res.pauses, res.burstFalse, res.bursts, res.lossFalse, res.lossBeats)
		cell := func(f, n int) string {
			if n == 0 {
				return "skipped"
			}
			return fmt.Sprintf("%d / %d", f, n)
		}
		fmt.Fprintf(b, "| %v | %s | %s | %s |\n", to, cell(res.pauseFalse, res.pauses), cell(res.burstFalse, res.bursts), cell(res.lossFalse, res.lossBeats))
		if to == liveness.DefaultTimeout {
			r.Target(report.Target{Name: "1 s pauses of a node: exits (default timeout)", Want: "0 of ≥ 100",
				Got: fmt.Sprintf("%d of %d", res.pauseFalse, res.pauses), Met: res.pauseFalse == 0 && res.pauses >= 100})
			if ns {
				r.Target(report.Target{Name: "1 s 100 % loss bursts: exits (default timeout)", Want: "0 of ≥ 100",
					Got: fmt.Sprintf("%d of %d", res.burstFalse, res.bursts), Met: res.burstFalse == 0 && res.bursts >= 100})
				r.Target(report.Target{Name: "5 % packet loss: exits (default timeout)", Want: "0",
					Got: fmt.Sprintf("%d in %v × %d pairs", res.lossFalse, c.detectLoss, c.detectPairs), Met: res.lossFalse == 0})
			}
		}
	}
	b.WriteString("\n")
	return nil
}

type blipResult struct {
	pauses, pauseFalse, bursts, burstFalse, lossBeats, lossFalse int
}

const (
	detectNS0, detectNS1   = "sbdetect0", "sbdetect1"
	detectDev0, detectDev1 = "sbdet0", "sbdet1"
	detectIP0, detectIP1   = "10.251.0.1", "10.251.0.2"
)

// loss makes each namespace drop pct % of the UDP it sends (nftables'
// numgen: this kernel has no netem, CONFIG_NET_SCH_NETEM unset); 0: none.
func loss(pct int) error {
	rules := "table inet sbdetect {}\nflush table inet sbdetect\ntable inet sbdetect {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
	switch {
	case pct >= 100:
		rules += "  meta l4proto udp drop\n"
	case pct > 0:
		rules += fmt.Sprintf("  meta l4proto udp numgen random mod 100 < %d drop\n", pct)
	}
	rules += " }\n}\n"
	for _, ns := range []string{detectNS0, detectNS1} {
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft (loss %d %%): %v: %s", pct, err, out)
		}
	}
	return nil
}

func netnsDown() {
	exec.Command("ip", "netns", "del", detectNS0).Run()
	exec.Command("ip", "netns", "del", detectNS1).Run()
}

func netnsUp() error {
	netnsDown()
	for _, s := range [][]string{{"netns", "add", detectNS0}, {"netns", "add", detectNS1},
		{"link", "add", detectDev0, "netns", detectNS0, "type", "veth", "peer", "name", detectDev1, "netns", detectNS1},
		{"-n", detectNS0, "addr", "add", detectIP0 + "/24", "dev", detectDev0}, {"-n", detectNS1, "addr", "add", detectIP1 + "/24", "dev", detectDev1},
		{"-n", detectNS0, "link", "set", detectDev0, "up"}, {"-n", detectNS1, "link", "set", detectDev1, "up"},
		{"-n", detectNS0, "link", "set", "lo", "up"}, {"-n", detectNS1, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			netnsDown()
			return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// blipTrials starts c.detectPairs pairs at timeout to and injects the
// pauses, the bursts (ns) and the 5 % loss (ns).
func blipTrials(c *config, to time.Duration, ns bool) (blipResult, error) {
	var res blipResult
	if ns {
		if err := netnsUp(); err != nil {
			return res, err
		}
		defer netnsDown()
		if err := loss(0); err != nil {
			return res, err
		}
	}
	work := filepath.Join(c.work, "detect-blips")
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return res, err
	}
	type child struct {
		cmd   *exec.Cmd
		lines <-chan proc.LogLine
	}
	var kids [2][]*child
	defer func() {
		for _, side := range kids {
			for _, k := range side {
				k.cmd.Process.Signal(syscall.SIGKILL)
				k.cmd.Wait()
			}
		}
	}()
	for p := range c.detectPairs {
		for k := range 2 {
			ip, nsName := []string{detectIP0, detectIP1}[k], []string{detectNS0, detectNS1}[k]
			if !ns {
				ip = "127.0.0.1"
			}
			args := []string{c.self, "detect-node", "-store", filepath.Join(work, fmt.Sprintf("store-%d", p)), "-run", fmt.Sprintf("pair-%d", p), // a store per run, as the agents have
				"-node", strconv.Itoa(k), "-nodes", "2", "-ip", ip, "-timeout", to.String(), "-interval", liveness.DefaultInterval.String()}
			if ns {
				args = append([]string{"ip", "netns", "exec", nsName}, args...) // ip execs: the pid is the child's
			}
			cmd := exec.Command(args[0], args[1:]...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				return res, err
			}
			logFile, _ := os.Create(filepath.Join(work, fmt.Sprintf("pair-%d-node-%d.log", p, k)))
			defer logFile.Close()
			if err := cmd.Start(); err != nil {
				return res, err
			}
			kids[k] = append(kids[k], &child{cmd: cmd, lines: proc.ReadLines(out, logFile, 4096)})
		}
	}
	// Every monitor hears its neighbour first.
	deadline := time.After(2 * time.Minute)
	for _, side := range kids {
		for _, k := range side {
		heard:
			for {
				select {
				case l, ok := <-k.lines:
					if !ok {
						return res, fmt.Errorf("a detect-node exited before it heard its neighbour")
					}
					if l.Msg() == "liveness: a neighbour heard" {
						break heard
					}
				case <-deadline:
					return res, fmt.Errorf("a pair did not hear each other within 2 min")
				}
			}
		}
	}
	// verdicts counts the silent reports since the last call.
	verdicts := func() int {
		n := 0
		for _, side := range kids {
			for _, k := range side {
				for drained := false; !drained; {
					select {
					case l, ok := <-k.lines:
						if !ok {
							drained = true
						} else if l.Msg() == "liveness: a neighbour's agent is silent" {
							n++
						}
					default:
						drained = true
					}
				}
			}
		}
		return n
	}
	const rounds = 10
	for range rounds {
		for _, k := range kids[1] {
			k.cmd.Process.Signal(syscall.SIGSTOP)
		}
		time.Sleep(time.Second)
		for _, k := range kids[1] {
			k.cmd.Process.Signal(syscall.SIGCONT)
		}
		time.Sleep(2500 * time.Millisecond)
		res.pauses += c.detectPairs
		res.pauseFalse += verdicts()
	}
	if !ns {
		return res, nil
	}
	for range rounds {
		if err := loss(100); err != nil {
			return res, err
		}
		time.Sleep(time.Second)
		if err := loss(0); err != nil {
			return res, err
		}
		time.Sleep(2500 * time.Millisecond)
		res.bursts += c.detectPairs
		res.burstFalse += verdicts()
	}
	if err := loss(5); err != nil {
		return res, err
	}
	time.Sleep(c.detectLoss)
	res.lossBeats = c.detectPairs * 2 * int(c.detectLoss/liveness.DefaultInterval)
	res.lossFalse = verdicts()
	return res, nil
}

// detectCost runs c.detectRing monitors in one child process on the
// loopback and reports what one node costs.
func detectCost(c *config, b *strings.Builder) error {
	const secs = 20
	out, err := exec.Command(c.self, "detect-ring", "-store", filepath.Join(c.work, "detect-ring"), "-nodes", strconv.Itoa(c.detectRing),
		"-seconds", strconv.Itoa(secs)).Output()
	if err != nil {
		return fmt.Errorf("detect-ring: %w", err)
	}
	var res ringResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("detect-ring said %q: %w", out, err)
	}
	per := res.CPUSeconds / float64(res.Nodes) / res.Seconds
	pps := 2 / liveness.DefaultInterval.Seconds()
	logf("ring of %d: %.3f CPU s in %.0f s, peak RSS %d KiB, %d bytes per heartbeat", res.Nodes, res.CPUSeconds, res.Seconds, res.PeakKiB, res.Bytes)
	fmt.Fprintf(b, "**Cost.** A ring of %d monitors in one process on the loopback (`spotbench detect-ring`; each node is a monitor with its own UDP socket, heartbeating its 2 neighbours every %v), measured over %d s once every node heard both neighbours: %.3f CPU s in all, **%.1f µs of CPU per node per second (%.4f %% of a core)**, peak RSS %.1f MiB for the process (%.1f KiB per node). Per node, at any N (a ring: each node talks to its 2 neighbours): %.0f heartbeats/s sent and %.0f received, %d bytes of UDP payload each (%d on the wire with UDP/IPv4 headers): %.1f KB/s each way.\n\n",
		res.Nodes, liveness.DefaultInterval, secs, res.CPUSeconds, per*1e6, per*100, float64(res.PeakKiB)/1024, float64(res.PeakKiB)/float64(res.Nodes), pps, pps, res.Bytes, res.Bytes+28, pps*float64(res.Bytes+28)/1000)
	return nil
}

type ringResult struct {
	Nodes      int     `json:"nodes"`
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
	PeakKiB    int64   `json:"peak_kib"`
	Bytes      int     `json:"bytes"`
}

// detectChild is `spotbench detect-node` (one monitor, its log on stdout
// as JSON lines) and `spotbench detect-ring` (N monitors, then the CPU
// they took as JSON).
func detectChild(name string, args []string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	store := fs.String("store", "", "the file store's directory")
	run := fs.String("run", "detect", "run id")
	node := fs.Int("node", 0, "this node")
	nodes := fs.Int("nodes", 2, "nodes (detect-ring: monitors)")
	ip := fs.String("ip", "127.0.0.1", "the address to listen and advertise on")
	interval := fs.Duration("interval", liveness.DefaultInterval, "heartbeat period")
	timeout := fs.Duration("timeout", liveness.DefaultTimeout, "silence timeout")
	secs := fs.Int("seconds", 20, "detect-ring: seconds measured")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	st, err := file.New(*store)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := func(k int, log *zap.Logger) liveness.Config {
		return liveness.Config{Store: st, RunID: *run, Node: k, Nodes: *nodes, Session: fmt.Sprintf("s%d-%d", k, time.Now().UnixNano()),
			Listen: net.JoinHostPort(*ip, "0"), Advertise: []string{*ip}, Interval: *interval, Timeout: *timeout, Log: log}
	}
	if name == "detect-node" {
		enc := zap.NewProductionEncoderConfig()
		enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stdout), zap.InfoLevel))
		if _, err := liveness.Start(ctx, cfg(*node, log)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		select {} // until killed
	}
	// detect-ring: count the neighbours heard through the log.
	heard := make(chan struct{}, 2**nodes)
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel),
		zap.Hooks(func(e zapcore.Entry) error {
			if e.Message == "liveness: a neighbour heard" {
				heard <- struct{}{}
			}
			return nil
		}))
	for k := range *nodes {
		if _, err := liveness.Start(ctx, cfg(k, log)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	want := 2 * *nodes
	if *nodes == 2 {
		want = 2
	}
	for range want {
		select {
		case <-heard:
		case <-time.After(3 * time.Minute):
			fmt.Fprintln(os.Stderr, "detect-ring: not every node heard its neighbours within 3 min")
			return 1
		}
	}
	cpu := func() float64 {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	c0, t0 := cpu(), time.Now()
	time.Sleep(time.Duration(*secs) * time.Second)
	res := ringResult{Nodes: *nodes, Seconds: time.Since(t0).Seconds(), CPUSeconds: cpu() - c0,
		PeakKiB: proc.VMKiB(os.Getpid(), "VmHWM"), Bytes: liveness.HeartbeatSize(*run, fmt.Sprintf("s%d-%d", 0, time.Now().UnixNano()), 0)}
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}
