package main

import (
	"fmt"
	"io"
	"math/rand/v2"
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

type e2eRun struct {
	total, toRequest, trainer, commit, upload time.Duration
	peakKiB                                   int64
}

// benchE2E: `spotagent run` with the stdlib example trainer writing an
// N-byte random payload per checkpoint, a fake AWS spot notice part-way;
// notice exposed → "checkpoint committed" read from the agent's json log.
// The 1 GiB runs also give the agent's peak RSS (VmHWM) during the upload.
func benchE2E(c *config, r *report.Report, s *benchstore.Stores) error {
	imds, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
	if err != nil {
		return err
	}
	defer imds.Close()
	trainPy, err := filepath.Abs("python/examples/train.py")
	if err != nil {
		return err
	}
	sizes := []struct {
		label string
		n     int64
	}{{"100 MiB", 100 << 20}, {"1 GiB", 1 << 30}}
	type storeSpec struct{ name, label, uri string }
	storesList := []storeSpec{
		{"file", "file (local disk)", "file://" + filepath.Join(c.work, "e2e-store")},
		{"s3", "S3 (MinIO)", "s3://" + benchstore.Bucket + "/e2e"},
		{"gcs", "GCS (fake-gcs-server)", "gs://" + benchstore.Bucket + "/e2e"},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "`spotagent run` (AWS fake, `--poll-interval 1s`; `spot/instance-action` read every 250 ms, the default `--aws-spot-poll-interval`) with `python/examples/train.py --save-bytes N` (a random payload in each checkpoint, written and fsynced by Python); a spot `terminate` notice is exposed at a random phase ~1–2 s after the trainer connects; measured: notice exposed → the agent's \"checkpoint committed\" log line. %d runs per cell, medians (min–max). Breakdown (medians): *notice → request* is the poll phase, *trainer save* is Python writing the checkpoint, *commit* is the agent's upload + manifest + latest.json (its own `total` field). Peak RSS is the agent's VmHWM (not the trainer's) read when the commit is logged.\n\n", c.e2eReps)
	b.WriteString("| store | checkpoint | notice → committed s | notice → request ms | trainer save s | commit s | commit MB/s | agent peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	var peakMax int64
	peakWhere := ""
	for _, st := range storesList {
		env := s.MinIO.Env()
		if st.name == "gcs" {
			env = s.GCSEnv()
		}
		for _, sz := range sizes {
			var runs []e2eRun
			for rep := range c.e2eReps {
				uri := fmt.Sprintf("%s-%d-%d", st.uri, sz.n>>20, rep)
				res, err := oneE2E(c, imds, env, uri, trainPy, sz.n)
				if err != nil {
					return fmt.Errorf("e2e %s %s: %w", st.name, sz.label, err)
				}
				logf("%-4s %-7s notice→committed %.2fs (request %.0f ms, trainer %.2fs, commit %.2fs), agent peak RSS %d MiB",
					st.name, sz.label, res.total.Seconds(), stats.MS(res.toRequest), res.trainer.Seconds(), res.commit.Seconds(), res.peakKiB/1024)
				runs = append(runs, res)
				if sz.n == 1<<30 && res.peakKiB > peakMax {
					peakMax, peakWhere = res.peakKiB, st.label
				}
				if st.name == "file" {
					os.RemoveAll(strings.TrimPrefix(uri, "file://"))
				} else if err := benchstore.DeletePrefix(env, uri); err != nil {
					logf("cleanup %s: %v", uri, err)
				}
				s.EmptyTrash()
			}
			get := func(f func(e2eRun) float64) []float64 {
				var xs []float64
				for _, x := range runs {
					xs = append(xs, f(x))
				}
				return xs
			}
			tot := get(func(x e2eRun) float64 { return x.total.Seconds() })
			lo, hi := stats.MinMax(tot)
			commit := stats.Median(get(func(x e2eRun) float64 { return x.commit.Seconds() }))
			fmt.Fprintf(&b, "| %s | %s | %.2f (%.2f–%.2f) | %.0f | %.2f | %.2f | %.0f | %.0f |\n", st.label, sz.label, stats.Median(tot), lo, hi,
				stats.Median(get(func(x e2eRun) float64 { return stats.MS(x.toRequest) })),
				stats.Median(get(func(x e2eRun) float64 { return x.trainer.Seconds() })), commit,
				float64(sz.n)/commit/1e6,
				slicesMax(get(func(x e2eRun) float64 { return float64(x.peakKiB) / 1024 })))
		}
	}
	r.Add("4. Notice → checkpoint committed, end to end", b.String())
	r.Command("spotagent run --store URI --cloud aws --aws-imds-endpoint http://127.0.0.1:PORT --poll-interval 1s --interval 1h --log-format json -- python3 python/examples/train.py --steps 10000000 --step-time 0.01 --save-bytes N")
	if peakMax > 0 {
		mib := float64(peakMax) / 1024
		r.Target(report.Target{Name: "agent peak RSS during a 1 GiB upload", Want: "≤ 200 MB", Got: fmt.Sprintf("%.0f MiB = %.0f MB (max over stores: %s)", mib, float64(peakMax)*1024/1e6, peakWhere),
			Met: float64(peakMax)*1024 <= 200e6, Margin: fmt.Sprintf("%+.0f MB", 200-float64(peakMax)*1024/1e6)})
	}
	return nil
}

func oneE2E(c *config, imds *fake.AWS, env []string, uri, trainPy string, n int64) (e2eRun, error) {
	imds.ClearTermination()
	dir := filepath.Join(c.work, "e2e")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return e2eRun{}, err
	}
	cmd := exec.Command(c.bin, "run", "--store", uri, "--cloud", "aws", "--aws-imds-endpoint", imds.URL(),
		"--poll-interval", c.pollInterval.String(), "--interval", "1h", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", filepath.Join(dir, "agent.sock"), "--log-format", "json",
		"--", "python3", trainPy, "--steps", "10000000", "--step-time", "0.01", "--save-bytes", strconv.FormatInt(n, 10))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return e2eRun{}, err
	}
	logPath := filepath.Join(c.work, "e2e.log")
	logFile, _ := os.Create(logPath)
	defer logFile.Close()
	if err := cmd.Start(); err != nil {
		return e2eRun{}, err
	}
	lines := proc.ReadLines(stderr, logFile, 256)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
	}()
	fail := func(err error) (e2eRun, error) {
		cmd.Process.Signal(syscall.SIGKILL)
		return e2eRun{}, fmt.Errorf("%w (log %s)", err, logPath)
	}
	timeout := time.After(5 * time.Minute)
	wait := func(msg string) (proc.LogLine, error) {
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return proc.LogLine{}, fmt.Errorf("agent exited before %q", msg)
				}
				if l.Msg() == msg {
					return l, nil
				}
			case <-timeout:
				return proc.LogLine{}, fmt.Errorf("timed out waiting for %q", msg)
			}
		}
	}
	if _, err := wait("trainer connected"); err != nil {
		return fail(err)
	}
	time.Sleep(time.Second + rand.N(c.pollInterval))
	exposed := imds.Terminate("terminate", time.Now().Add(2*time.Minute).Truncate(time.Second))
	req, err := wait("checkpoint requested")
	if err != nil {
		return fail(err)
	}
	com, err := wait("checkpoint committed")
	if err != nil {
		return fail(err)
	}
	peak := proc.VMKiB(cmd.Process.Pid, "VmHWM")
	res := e2eRun{total: com.At.Sub(exposed), toRequest: req.At.Sub(exposed), peakKiB: peak}
	if v, ok := com.Raw["commit_s"].(float64); ok {
		res.commit = time.Duration(v * float64(time.Second))
	}
	if v, ok := com.Raw["upload_s"].(float64); ok {
		res.upload = time.Duration(v * float64(time.Second))
	}
	res.trainer = com.At.Sub(req.At) - res.commit
	// Drain the rest so the agent never blocks on a full pipe.
	go func() {
		for range lines {
		}
	}()
	return res, nil
}

// idleSample is one process's figures over one idle window.
type idleSample struct {
	cpu                    float64 // % of one core
	rssMedian, rssMax, hwm float64 // MiB (VmRSS sampled every second; VmHWM)
	anon, file             float64 // MiB, RssAnon and RssFile at the window's end
}

// benchIdle: the agent (`spotagent run` with an idle child) and `spotagent
// watch`, polling the AWS fake every second, side by side for the window:
// CPU from /proc/PID/stat, RSS from /proc/PID/status. c.idleRuns runs, each
// with fresh processes; the table shows medians over the runs. With
// c.baselineBin the same processes of that binary run beside them, polling
// the same fake (before/after on one machine at one time).
func benchIdle(c *config, r *report.Report) error {
	imds, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
	if err != nil {
		return err
	}
	defer imds.Close()
	type binSpec struct{ label, path string }
	bins := []binSpec{{"spotagent", c.bin}}
	if c.baselineBin != "" {
		bins = append(bins, binSpec{"baseline", c.baselineBin})
	}
	procNames := []string{"spotagent run (agent process; child: sleep)", "spotagent watch"}
	// The processes run copies of the binaries, dropped from the page cache
	// before each run: every run execs them cold, as a new machine does. Run
	// in place, a binary the Go linker has just written maps ~1 MiB more
	// (RssFile) than the same bytes copied or read from disk, so a fresh build
	// measured beside a copied baseline looked ~1 MiB worse than it is.
	staged := make([]string, len(bins))
	for i, b := range bins {
		var err error
		if staged[i], err = proc.StageBinary(filepath.Join(c.work, "idle-bin", b.label), b.path); err != nil {
			return err
		}
	}
	stagedBase := ""
	if len(staged) > 1 {
		stagedBase = staged[1]
	}
	samples := map[[2]int][]idleSample{} // [bin, proc] → one sample per run
	var reqs int64
	var window time.Duration
	for run := range c.idleRuns {
		for _, p := range staged {
			if err := proc.DropCached(p); err != nil {
				return err
			}
		}
		got, n, el, err := idleRun(c, imds, staged[0], stagedBase, run)
		if err != nil {
			return err
		}
		reqs += n
		window = el
		for k, v := range got {
			samples[k] = append(samples[k], v)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Both processes poll the AWS fake every %s, side by side, for %s after a 5 s warm-up; %d runs, each with fresh processes (%d metadata requests in all). CPU = Δ(utime+stime) from /proc/PID/stat over the window; RSS sampled every second from /proc/PID/status (VmRSS); RssAnon (heap, stacks, written data) and RssFile (the binary's pages mapped from the file) at the window's end. Medians over the runs; RSS max and VmHWM are the largest of any run. Each binary runs from a copy dropped from the page cache before every run (a cold exec, as on a new machine).", c.pollInterval, window.Round(time.Second), c.idleRuns, reqs)
	if len(bins) > 1 {
		fmt.Fprintf(&b, " *baseline* is %s, run beside the binary under test against the same fake.", c.baselineBin)
	}
	b.WriteString("\n\n| binary | process | CPU % of one core | RSS median MiB | RSS max MiB | VmHWM MiB | RssAnon MiB | RssFile MiB | binary size MB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for bi, bin := range bins {
		size := 0.0
		if fi, err := os.Stat(bin.path); err == nil {
			size = float64(fi.Size()) / 1e6
		}
		for pi, name := range procNames {
			xs := samples[[2]int{bi, pi}]
			get := func(f func(idleSample) float64) []float64 {
				var out []float64
				for _, x := range xs {
					out = append(out, f(x))
				}
				return out
			}
			cpu := stats.Median(get(func(x idleSample) float64 { return x.cpu }))
			rss := stats.Median(get(func(x idleSample) float64 { return x.rssMedian }))
			_, hi := stats.MinMax(get(func(x idleSample) float64 { return x.rssMax }))
			_, hwm := stats.MinMax(get(func(x idleSample) float64 { return x.hwm }))
			anon := stats.Median(get(func(x idleSample) float64 { return x.anon }))
			file := stats.Median(get(func(x idleSample) float64 { return x.file }))
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", bin.label, name, cpu, rss, hi, hwm, anon, file, size)
			logf("%s, %s: CPU %.2f %%, RSS %.1f MiB (anon %.1f, file %.1f), medians of %d", bin.label, name, cpu, rss, anon, file, len(xs))
			if bi == 0 && pi == 0 {
				mb := rss * (1 << 20) / 1e6
				r.Target(report.Target{Name: "idle RSS (agent, polling AWS at 1 s)", Want: fmt.Sprintf("median of %d runs ≤ 28 MB", c.idleRuns),
					Got: fmt.Sprintf("%.1f MiB = %.1f MB (RssAnon %.1f + RssFile %.1f MiB; max %.1f MiB)", rss, mb, anon, file, hi),
					Met: mb <= 28, Margin: fmt.Sprintf("%+.1f MB", 28-mb)})
				r.Target(report.Target{Name: "idle CPU (agent)", Want: "≤ 0.5 % of one core", Got: fmt.Sprintf("%.2f %%", cpu), Met: cpu <= 0.5, Margin: fmt.Sprintf("%+.2f points", 0.5-cpu)})
			}
		}
	}
	r.Add("5. Footprint while idle-polling", b.String())
	r.Command("spotagent run --store file:///TMP/store --cloud aws --aws-imds-endpoint http://127.0.0.1:PORT --poll-interval 1s -- sleep 100000   # sampled via /proc/PID")
	r.Command("spotagent watch --cloud aws --aws-imds-endpoint http://127.0.0.1:PORT --poll-interval 1s")
	r.Command("SPOTBENCH_ONLY=footprint SPOTBENCH_BASELINE_BIN=OLD_BINARY make bench   # this section alone, an older build beside this one")
	return nil
}

// idleRun runs the idle processes of bin (and of baseline, when set) once
// and returns each one's figures, keyed by [binary, process], the metadata
// requests in the window and the window's length.
func idleRun(c *config, imds *fake.AWS, bin, baseline string, run int) (map[[2]int]idleSample, int64, time.Duration, error) {
	dir := filepath.Join(c.work, fmt.Sprintf("idle-%d", run))
	os.RemoveAll(dir)
	os.MkdirAll(dir, 0o700)
	type idleProc struct {
		key [2]int
		cmd *exec.Cmd
	}
	var procs []idleProc
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { p.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(40 * time.Second):
				p.cmd.Process.Kill()
			}
		}
	}()
	for bi, path := range []string{bin, baseline} {
		if path == "" {
			continue
		}
		sub := filepath.Join(dir, strconv.Itoa(bi))
		argv := [][]string{
			{"run", "--store", "file://" + filepath.Join(sub, "store"), "--checkpoint-dir", filepath.Join(sub, "ckpt"),
				"--socket", filepath.Join(sub, "agent.sock"), "--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", c.pollInterval.String(),
				"--log-format", "json", "--", "sleep", "100000"},
			{"watch", "--cloud", "aws", "--aws-imds-endpoint", imds.URL(), "--poll-interval", c.pollInterval.String()},
		}
		for pi, args := range argv {
			cmd := exec.Command(path, args...)
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			if err := cmd.Start(); err != nil {
				return nil, 0, 0, err
			}
			procs = append(procs, idleProc{[2]int{bi, pi}, cmd})
		}
	}
	time.Sleep(5 * time.Second) // start-up is not idle
	reqs0 := imds.Requests()
	t0 := make([]int64, len(procs))
	for i, p := range procs {
		var err error
		if t0[i], err = proc.CPUTicks(p.cmd.Process.Pid); err != nil {
			return nil, 0, 0, err
		}
	}
	start := time.Now()
	rss := make([][]float64, len(procs))
	for time.Since(start) < c.idle {
		time.Sleep(time.Second)
		for i, p := range procs {
			rss[i] = append(rss[i], float64(proc.VMKiB(p.cmd.Process.Pid, "VmRSS"))/1024)
		}
	}
	el := time.Since(start)
	out := map[[2]int]idleSample{}
	for i, p := range procs {
		pid := p.cmd.Process.Pid
		t1, err := proc.CPUTicks(pid)
		if err != nil {
			return nil, 0, 0, err
		}
		_, hi := stats.MinMax(rss[i])
		out[p.key] = idleSample{cpu: float64(t1-t0[i]) / proc.ClkTck / el.Seconds() * 100, rssMedian: stats.Median(rss[i]), rssMax: hi,
			hwm: float64(proc.VMKiB(pid, "VmHWM")) / 1024, anon: float64(proc.VMKiB(pid, "RssAnon")) / 1024, file: float64(proc.VMKiB(pid, "RssFile")) / 1024}
	}
	return out, imds.Requests() - reqs0, el, nil
}

func benchSimulate(c *config, r *report.Report) error {
	start := time.Now()
	cmd := exec.Command(c.bin, "simulate", "--grid")
	var progress strings.Builder
	cmd.Stderr = &progress // its progress lines; the table is stdout
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("simulate --grid: %w: %s", err, progress.String())
	}
	r.Add("6. Checkpoint frequency: `spotagent simulate --grid`", fmt.Sprintf("Verbatim output (took %s):\n\n%s\n", time.Since(start).Round(time.Second), strings.TrimSpace(string(out))))
	r.Command("spotagent simulate --grid")
	return nil
}
