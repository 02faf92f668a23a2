package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/file"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// overlapTrainer boots in BOOT seconds (a sleep: what importing torch,
// building the model and CUDA/NCCL init cost a real trainer, without
// taking CPU from the restore), then asks for its resume step (which waits
// for the restore when it runs beside the boot), checks the restored step
// file, runs its first step and prints the wall-clock time of it.
const overlapTrainer = `
import json, os, sys, time
sys.path.insert(0, os.path.join(REPO, "python"))
import spotagent
boot = float(sys.argv[1])
agent = spotagent.connect()
time.sleep(boot)
step = agent.resume_step
with open(os.path.join(agent.resume_dir, "step.json")) as f:
    assert json.load(f)["step"] == step, "restored step file disagrees"
agent.poll(step + 1)
print("bench: first_step %.6f resumed %d" % (time.time(), step), flush=True)
agent.close()
`

const overlapStep = 1000

type overlapRun struct {
	total   float64 // agent start → the trainer's first resumed step, s
	restore float64 // the agent's restore (its "took"), s
}

// benchOverlap (issue 30 item 1): agent start → the trainer's first
// resumed training step, with a GiB-sized checkpoint in a file:// store
// and a trainer that boots in B s (B ≈ the restore time), serial
// (--restore-serial: restore, then start the trainer) vs overlapped (the
// default: start it at once, restore meanwhile).
func benchOverlap(c *config, r *report.Report) error {
	work := filepath.Join(c.work, "overlap")
	os.RemoveAll(work)
	defer os.RemoveAll(work)
	storeDir := filepath.Join(work, "store")
	logf("seeding a %g GiB checkpoint (4 files) into file://%s", c.overlapGiB, storeDir)
	if err := seedOverlap(work, storeDir, c.overlapGiB); err != nil {
		return err
	}
	script := filepath.Join(work, "trainer.py")
	repoDir, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	if err := os.WriteFile(script, []byte("REPO = "+strconv.Quote(repoDir)+"\n"+overlapTrainer), 0o644); err != nil {
		return err
	}
	n := 0
	run := func(serial bool, boot float64) (overlapRun, error) {
		n++
		return oneOverlap(c, work, storeDir, script, n, serial, boot)
	}
	// Calibration: the restore alone (a trainer that boots at once).
	cal, err := run(true, 0)
	if err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	boot := max(1, float64(int(cal.restore*10+0.5))/10)
	logf("calibration: restore %.2fs; the trainer boots in B = %.1fs", cal.restore, boot)
	var serial, overlapped []overlapRun
	for rep := range c.e2eReps {
		order := []bool{true, false}
		if rep%2 == 1 {
			order = []bool{false, true}
		}
		for _, s := range order {
			res, err := run(s, boot)
			if err != nil {
				return err
			}
			mode := "overlapped"
			if s {
				mode, serial = "serial", append(serial, res)
			} else {
				overlapped = append(overlapped, res)
			}
			logf("%-10s agent start → first resumed step %.2fs (restore %.2fs, boot %.1fs)", mode, res.total, res.restore, boot)
		}
	}
	col := func(runs []overlapRun, f func(overlapRun) float64) []float64 {
		var xs []float64
		for _, x := range runs {
			xs = append(xs, f(x))
		}
		return xs
	}
	tot := func(x overlapRun) float64 { return x.total }
	rst := func(x overlapRun) float64 { return x.restore }
	var b strings.Builder
	fmt.Fprintf(&b, "`spotagent run --store file://DIR` (local disk: the restore reads, verifies the CRC32C of and writes %g GiB in 4 files, then the agent hands the directory over) with a trainer that boots in B s (a sleep: import, model, CUDA/NCCL init without their CPU), then reads `agent.resume_step` (blocks while the restore runs), checks the restored step file and runs its first step. Measured: `spotagent run` started → the trainer's first resumed step (wall clock). *serial*: `--restore-serial` (restore, then start the trainer: the behaviour before); *overlapped*: the default (start the trainer at once, restore meanwhile). B = the restore time of a calibration run, %.1f s. %d runs per mode, alternating, medians (min–max). Target: overlapped ≤ 1.1 × max(restore, B).\n\n", c.overlapGiB, boot, c.e2eReps)
	b.WriteString("| mode | agent start → first resumed step s | restore s | B s | max(restore, B) s | restore + B s |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, m := range []struct {
		name string
		runs []overlapRun
	}{{"serial", serial}, {"overlapped", overlapped}} {
		t := col(m.runs, tot)
		lo, hi := stats.MinMax(t)
		rs := stats.Median(col(m.runs, rst))
		fmt.Fprintf(&b, "| %s | %.2f (%.2f–%.2f) | %.2f | %.1f | %.2f | %.2f |\n", m.name, stats.Median(t), lo, hi, rs, boot, max(rs, boot), rs+boot)
	}
	r.Add(fmt.Sprintf("Restore overlapped with the trainer's start (%g GiB)", c.overlapGiB), b.String())
	r.Command("spotagent run [--restore-serial] --store file://DIR --cloud none --interval 1h --log-format json -- python3 trainer.py B")
	got := stats.Median(col(overlapped, tot))
	bound := 1.1 * max(stats.Median(col(overlapped, rst)), boot)
	r.Target(report.Target{Name: fmt.Sprintf("agent start → first resumed step, %g GiB, trainer boot B = %.1f s", c.overlapGiB, boot),
		Want: "overlapped ≤ 1.1 × max(restore, B)", Got: fmt.Sprintf("%.2f s (bound %.2f s; serial %.2f s)", got, bound, stats.Median(col(serial, tot))),
		Met: got <= bound, Margin: fmt.Sprintf("%+.2f s", bound-got)})
	return nil
}

// seedOverlap commits a checkpoint of gib GiB (four files of random bytes
// and a step file) at step overlapStep into the file store at storeDir.
func seedOverlap(work, storeDir string, gib float64) error {
	src := filepath.Join(work, "src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	per := int64(gib * (1 << 30) / 4)
	rng := rand.NewChaCha8([32]byte{30, 1})
	buf := make([]byte, 8<<20)
	for i := range 4 {
		f, err := os.Create(filepath.Join(src, fmt.Sprintf("shard-%d.bin", i)))
		if err != nil {
			return err
		}
		for left := per; left > 0; {
			k := min(left, int64(len(buf)))
			rng.Read(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				f.Close()
				return err
			}
			left -= k
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(src, "step.json"), []byte(fmt.Sprintf(`{"step": %d}`, overlapStep)), 0o600); err != nil {
		return err
	}
	st, err := file.New(storeDir)
	if err != nil {
		return err
	}
	defer st.Close()
	cm := &checkpoint.Committer{Store: st, RunID: "bench-overlap"}
	_, err = cm.Commit(context.Background(), checkpoint.Request{Dir: src, ID: "0ver1a900001", Step: overlapStep})
	return err
}

// oneOverlap runs the agent once, from a fresh checkpoint directory (no
// local copy to reuse), and reads the trainer's first step and the
// agent's restore time from their output.
func oneOverlap(c *config, work, storeDir, script string, n int, serial bool, boot float64) (overlapRun, error) {
	ckpt := filepath.Join(work, fmt.Sprintf("ckpt-%d", n))
	defer os.RemoveAll(ckpt)
	args := []string{"run", "--store", "file://" + storeDir, "--run-id", "bench-overlap", "--checkpoint-dir", ckpt,
		"--socket", filepath.Join(work, fmt.Sprintf("s%d.sock", n)), "--cloud", "none", "--interval", "1h",
		"--log-format", "json", "--log-level", "info"}
	if serial {
		args = append(args, "--restore-serial")
	}
	args = append(args, "--", "/usr/bin/python3", script, strconv.FormatFloat(boot, 'f', 1, 64))
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Flush what an earlier run left dirty, so that it is not this run's.
	exec.Command("sync").Run()
	t0 := time.Now()
	err := cmd.Run()
	if err != nil {
		return overlapRun{}, fmt.Errorf("spotagent run: %w\n%s", err, proc.Tail(out.String(), 3000))
	}
	var res overlapRun
	first, took := false, false
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, "bench: first_step "); ok {
			var at float64
			var step int
			if _, err := fmt.Sscanf(rest, "%f resumed %d", &at, &step); err != nil || step != overlapStep {
				return res, fmt.Errorf("trainer line %q: want resumed %d", l, overlapStep)
			}
			res.total = at - float64(t0.UnixNano())/1e9
			first = true
			continue
		}
		var e struct {
			Msg  string `json:"msg"`
			Took any    `json:"took"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "restored checkpoint" {
			switch v := e.Took.(type) {
			case float64:
				res.restore, took = v, true
			case string:
				if d, err := time.ParseDuration(v); err == nil {
					res.restore, took = d.Seconds(), true
				}
			}
		}
	}
	if !first || !took {
		return res, fmt.Errorf("no first step or restore time in the output:\n%s", proc.Tail(out.String(), 3000))
	}
	return res, nil
}
