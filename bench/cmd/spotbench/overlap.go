package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// The overlap section (issue 30 item 1, issue 51 item 2): a new machine's
// agent start → the trainer's first resumed step, with the restore run
// beside the trainer's boot (the default) or before it (--restore-serial),
// against max(restore, boot). The trainer is bench/overlap_trainer.py:
// "sleep" boots in a sleep (no CPU taken from the restore), "torch" is a
// real one (import torch, a model built, the restored files torch.loaded).
// The boot is measured: the same trainer, the same agent, nothing to
// restore (a calibration run). Each run's timestamps (the agent's log
// lines, the trainer's marks) and the CPU each party used make the
// breakdown of where the time goes.

const (
	overlapStep    = 1000
	overlapTrainer = "bench/overlap_trainer.py"
	overlapSeed    = "bench/overlap_seed.py"
)

// overlapRun is one run: its marks (seconds from the agent's start) and
// the CPU each party used from the agent's start to the first step.
type overlapRun struct {
	total   float64            // agent start → the trainer's first step, s
	restore float64            // the agent's restore (its "took"), s; 0: nothing restored
	marks   map[string]float64 // stage → s from the agent's start
	cpu     map[string]float64 // party → CPU s in the window (agent, trainer, others)
	ticks   map[string]float64 // stage → the trainer's CPU s so far
	load1   float64            // 1-minute load average at the run's start
}

// overlapStages are the breakdown's rows: a mark's name and what it is.
var overlapStages = []struct{ key, what string }{
	{"log", "agent's first log line"},
	{"restore_start", "restore starts"},
	{"child", "trainer forked and exec'd (agent's log)"},
	{"py_start", "trainer's python runs its first line"},
	{"loop", "the agent's loop runs (\"trainer started\")"},
	{"guard", "trainer's guard ready (agent's log)"},
	{"imported", "`import torch` done"},
	{"accepted", "trainer's connection accepted (agent's log)"},
	{"welcome", "hello welcomed (agent's log; overlapped: restore pending)"},
	{"connected", "`spotagent.connect()` returned"},
	{"restore_end", "restore ends (files in place, agent's log)"},
	{"booted", "trainer booted (sleep over / model built)"},
	{"resumed", "trainer has its resume (`agent.resume_step` returned)"},
	{"loaded", "restored files loaded (torch: `torch.load`)"},
	{"first_step", "first step done"},
}

type overlapCase struct {
	name, mode string  // mode: the trainer's argv[1]
	boot       float64 // the sleep of mode "sleep"
	calib      []overlapRun
	serial     []overlapRun
	overlapped []overlapRun
}

// benchOverlap measures agent start → first resumed step for each trainer
// (calibration: nothing to restore; serial; overlapped), c.e2eReps runs
// of each (-overlap-reps), interleaved.
func benchOverlap(c *config, r *report.Report) error {
	work := filepath.Join(c.work, "overlap")
	os.RemoveAll(work)
	defer os.RemoveAll(work)
	storeDir, emptyDir := filepath.Join(work, "store"), filepath.Join(work, "empty")
	if err := os.MkdirAll(emptyDir, 0o700); err != nil {
		return err
	}
	py := proc.TorchPython()
	var err error
	logf("seeding a %g GiB checkpoint (model.pt, 4 × optim-N.pt: torch.save) into file://%s", c.overlapGiB, storeDir)
	if err := seedOverlap(py, work, storeDir, c.overlapGiB); err != nil {
		return err
	}
	load0, procs0, busy0, t0 := loadavg1(), readProcCPU(), machineTicks(), time.Now()
	n := 0
	run := func(store string, serial bool, oc *overlapCase) (overlapRun, error) {
		n++
		return oneOverlap(c, py, work, store, n, serial, oc)
	}
	// The sleep: about the restore's time, so that neither hides the
	// other (the second of two probes: the first warms the page cache).
	var probe overlapRun
	for range 2 {
		if probe, err = run(storeDir, true, &overlapCase{mode: "sleep"}); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	cases := []*overlapCase{
		{name: "wait", mode: "sleep"}, // asks at once: waits for the restore
		{name: "sleep", mode: "sleep", boot: max(1, float64(int(probe.restore*10+0.5))/10)},
		{name: "torch", mode: "torch"},
	}
	logf("probe: restore %.2fs; the sleep trainer sleeps %.1fs", probe.restore, cases[1].boot)
	for rep := range c.overlapReps {
		for _, oc := range cases {
			kinds := []string{"calibration", "serial", "overlapped"}
			if rep%2 == 1 {
				kinds = []string{"overlapped", "calibration", "serial"}
			}
			for _, k := range kinds {
				store := storeDir
				if k == "calibration" {
					store = emptyDir
				}
				res, err := run(store, k == "serial", oc)
				if err != nil {
					return fmt.Errorf("%s %s: %w", oc.name, k, err)
				}
				switch k {
				case "calibration":
					oc.calib = append(oc.calib, res)
				case "serial":
					oc.serial = append(oc.serial, res)
				default:
					oc.overlapped = append(oc.overlapped, res)
				}
				logf("%s %-11s agent start → first step %.2fs (restore %.2fs; cpu agent %.2f trainer %.2f others %.2f s; load %.1f)",
					oc.name, k, res.total, res.restore, res.cpu["agent"], res.cpu["trainer"], res.cpu["others"], res.load1)
			}
		}
	}
	load1, top, busy1, took := loadavg1(), topCPU(procs0, readProcCPU(), 8), machineTicks(), time.Since(t0)

	var b strings.Builder
	fmt.Fprintf(&b, "`spotagent run --store file://DIR` (local disk: the restore reads, verifies the CRC32C of and writes %g GiB in 6 files, then the agent hands the directory over) around `bench/overlap_trainer.py` (%s). "+
		"*wait*: connects and asks for its resume step at once (it waits for the restore), checks the restored step file. *sleep*: the same after a sleep of %.1f s (about the restore's time: a boot that takes no CPU from the restore). "+
		"*torch*: a real trainer: `import torch` (Debian's 1.13), connect, builds its model (8 × Linear(2048, 2048), 128 MiB), reads its resume step, `torch.load`s the restored files (model.pt into the model, 4 × optim-N.pt) and runs one training step. "+
		"Measured: `spotagent run` started → the trainer's first step (wall clock). *calibration*: the same agent and trainer with nothing to restore (an empty store): the **boot**; *serial*: `--restore-serial` (restore, then start the trainer); *overlapped*: the default (start the trainer at once, restore meanwhile). "+
		"*restore*: the agent's own time for it (\"restored checkpoint\" took); max(restore, boot) takes the serial runs' restore (nothing beside it) and the calibration's boot. %d runs of each, interleaved, medians (min–max). Target (issue 51): overlapped ≤ 1.15 × max(restore, boot) + 1 s.\n\n",
		c.overlapGiB, py, cases[1].boot, c.overlapReps)
	b.WriteString("| trainer | mode | agent start → first step s | restore s | boot s | max(restore, boot) s | bound s |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, oc := range cases {
		boot, rest := overlapMedian(oc.calib, totalOf), overlapMedian(oc.serial, restoreOf)
		bound := 1.15*max(rest, boot) + 1
		for _, m := range []struct {
			name string
			runs []overlapRun
		}{{"calibration (nothing to restore)", oc.calib}, {"serial", oc.serial}, {"overlapped", oc.overlapped}} {
			t := runsCol(m.runs, totalOf)
			lo, hi := stats.MinMax(t)
			rs := "—"
			if len(m.runs) > 0 && m.runs[0].restore > 0 {
				rs = fmt.Sprintf("%.2f", overlapMedian(m.runs, restoreOf))
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f (%.2f–%.2f) | %s | %.2f | %.2f | %.2f |\n", oc.name, m.name, stats.Median(t), lo, hi, rs, boot, max(rest, boot), bound)
		}
	}
	b.WriteString("\nWhere the time goes: each stage's time from the agent's start (medians; the agent's stages from its JSON log's timestamps, ms resolution; the trainer's from its `time.time()`), and the CPU each party used over the whole window (agent start → first step: `/proc/PID/stat` utime+stime of the agent at the window's end — it starts at 0 —, of the trainer, and the machine's busy time from `/proc/stat` less theirs: *others*).\n\n")
	b.WriteString("| s from the agent's start |")
	var sets [][]overlapRun
	for _, oc := range cases {
		for _, m := range []struct {
			name string
			runs []overlapRun
		}{{"calibration", oc.calib}, {"serial", oc.serial}, {"overlapped", oc.overlapped}} {
			fmt.Fprintf(&b, " %s %s |", oc.name, m.name)
			sets = append(sets, m.runs)
		}
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(sets)) + "\n")
	for _, st := range overlapStages {
		var cells []string
		any := false
		for _, runs := range sets {
			var xs []float64
			for _, x := range runs {
				if v, ok := x.marks[st.key]; ok {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				cells = append(cells, "—")
				continue
			}
			any = true
			cells = append(cells, fmt.Sprintf("%.2f", stats.Median(xs)))
		}
		if any {
			fmt.Fprintf(&b, "| %s | %s |\n", st.what, strings.Join(cells, " | "))
		}
	}
	for _, p := range []struct{ key, what string }{{"agent", "CPU s: agent"}, {"trainer", "CPU s: trainer"}, {"others", "CPU s: everything else on the machine"}, {"idle", "CPU s: idle (of 2 × window)"}} {
		var cells []string
		for _, runs := range sets {
			var xs []float64
			for _, x := range runs {
				xs = append(xs, x.cpu[p.key])
			}
			cells = append(cells, fmt.Sprintf("%.2f", stats.Median(xs)))
		}
		fmt.Fprintf(&b, "| %s | %s |\n", p.what, strings.Join(cells, " | "))
	}
	for _, p := range []struct{ from, to, what string }{{"", "booted", "trainer CPU s: its boot (start → booted)"}, {"resumed", "loaded", "trainer CPU s: its load (resume → loaded)"}} {
		var cells []string
		for _, runs := range sets {
			var xs []float64
			for _, x := range runs {
				to, ok := x.ticks[p.to]
				if from, ok2 := x.ticks[p.from]; ok && (ok2 || p.from == "") {
					xs = append(xs, to-from)
				}
			}
			if len(xs) == 0 {
				cells = append(cells, "—")
				continue
			}
			cells = append(cells, fmt.Sprintf("%.2f", stats.Median(xs)))
		}
		fmt.Fprintf(&b, "| %s | %s |\n", p.what, strings.Join(cells, " | "))
	}
	var cells []string
	for _, runs := range sets {
		lo, hi := stats.MinMax(runsCol(runs, func(x overlapRun) float64 { return x.load1 }))
		cells = append(cells, fmt.Sprintf("%.1f–%.1f", lo, hi))
	}
	fmt.Fprintf(&b, "| load average (1 min) at the runs' starts | %s |\n", strings.Join(cells, " | "))
	fmt.Fprintf(&b, "\n%d cores; load average (1 min) %.2f before the section, %.2f after. Over the section's %.0f s the machine was busy %.0f CPU s of %.0f; the most CPU by command (processes alive at its end, with their reaped children's: a test binary's or a build's CPU shows under the go or shell that ran it; the section's own under overlap-spotben, spotagent and python3): %s.\n",
		runtime.NumCPU(), load0, load1, took.Seconds(), float64(busy1-busy0)/proc.ClkTck, took.Seconds()*float64(runtime.NumCPU()), top)
	r.Add(fmt.Sprintf("Restore overlapped with the trainer's start (%g GiB)", c.overlapGiB), b.String())
	r.Command("spotagent run [--restore-serial] --store file://DIR --cloud none --interval 1h --log-format json -- python3 bench/overlap_trainer.py sleep|torch B")
	for _, oc := range cases {
		boot, rest := overlapMedian(oc.calib, totalOf), overlapMedian(oc.serial, restoreOf)
		bound := 1.15*max(rest, boot) + 1
		got := overlapMedian(oc.overlapped, totalOf)
		load := ""
		if oc.mode == "torch" {
			load = fmt.Sprintf("; of which the trainer's torch.load %.2f s", overlapMedian(oc.overlapped, func(x overlapRun) float64 { return x.marks["loaded"] - x.marks["resumed"] }))
		}
		r.Target(report.Target{Name: fmt.Sprintf("agent start → first resumed step, %g GiB, %s trainer (boot %.2f s, restore %.2f s)", c.overlapGiB, oc.name, boot, rest),
			Want: "overlapped ≤ 1.15 × max(restore, boot) + 1 s", Got: fmt.Sprintf("%.2f s (bound %.2f s; serial %.2f s%s)", got, bound, overlapMedian(oc.serial, totalOf), load),
			Met: got <= bound, Margin: fmt.Sprintf("%+.2f s", bound-got)})
	}
	return nil
}

func totalOf(x overlapRun) float64   { return x.total }
func restoreOf(x overlapRun) float64 { return x.restore }

func runsCol(runs []overlapRun, f func(overlapRun) float64) []float64 {
	var xs []float64
	for _, x := range runs {
		xs = append(xs, f(x))
	}
	return xs
}

func overlapMedian(runs []overlapRun, f func(overlapRun) float64) float64 {
	return stats.Median(runsCol(runs, f))
}

// loadavg1 is the 1-minute load average.
func loadavg1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// machineTicks is /proc/stat's busy (all but idle and iowait) clock ticks,
// over every core.
func machineTicks() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var sum, idle int64
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		sum += v
		if i == 3 || i == 4 {
			idle += v
		}
	}
	return sum - idle
}

// seedOverlap commits a checkpoint of gib GiB (bench/overlap_seed.py's
// files) at step overlapStep into the file store at storeDir.
func seedOverlap(py, work, storeDir string, gib float64) error {
	src := filepath.Join(work, "src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	out, err := exec.Command(py, overlapSeed, src, strconv.FormatInt(int64(gib*(1<<30)), 10), strconv.Itoa(overlapStep)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", overlapSeed, err, proc.Tail(string(out), 2000))
	}
	st, err := file.New(storeDir)
	if err != nil {
		return err
	}
	defer st.Close()
	cm := &commit.Committer{Store: st, RunID: "bench-overlap"}
	_, err = cm.Commit(context.Background(), commit.Request{Dir: src, ID: "0ver1a900001", Step: overlapStep})
	return err
}

// oneOverlap runs the agent once, from a fresh checkpoint directory (no
// local copy to reuse), and reads the stages' times and the CPU used
// from the agent's log and the trainer's output.
func oneOverlap(c *config, py, work, storeDir string, n int, serial bool, oc *overlapCase) (overlapRun, error) {
	ckpt := filepath.Join(work, fmt.Sprintf("ckpt-%d", n))
	defer os.RemoveAll(ckpt)
	args := []string{"run", "--store", "file://" + storeDir, "--run-id", "bench-overlap", "--checkpoint-dir", ckpt,
		"--socket", filepath.Join(work, fmt.Sprintf("s%d.sock", n)), "--cloud", "none", "--interval", "1h",
		"--log-format", "json", "--log-level", "debug"} // debug: "child started", "connection accepted"
	if serial {
		args = append(args, "--restore-serial")
	}
	args = append(args, "--", py, overlapTrainer, oc.mode, strconv.FormatFloat(oc.boot, 'f', 1, 64))
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Flush what an earlier run left dirty, so that it is not this run's.
	exec.Command("sync").Run()
	res := overlapRun{marks: map[string]float64{}, cpu: map[string]float64{}, ticks: map[string]float64{}, load1: loadavg1()}
	busy0 := machineTicks()
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("spotagent run: %w\n%s", err, proc.Tail(out.String(), 3000))
	}
	at := func(t float64) float64 { return t - float64(t0.UnixNano())/1e9 }
	first, cpu := false, false
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, "bench: t "); ok {
			var name string
			var t float64
			var ticks int64
			if _, err := fmt.Sscanf(rest, "%s %f %d", &name, &t, &ticks); err == nil {
				res.marks[name] = at(t)
				res.ticks[name] = float64(ticks) / proc.ClkTck
			}
			continue
		}
		if rest, ok := strings.CutPrefix(l, "bench: first_step "); ok {
			var t float64
			var step int
			if _, err := fmt.Sscanf(rest, "%f resumed %d", &t, &step); err != nil || (step != overlapStep && step != -1) {
				return res, fmt.Errorf("trainer line %q: want resumed %d", l, overlapStep)
			}
			if want := storeDir != filepath.Join(work, "empty"); want != (step == overlapStep) {
				return res, fmt.Errorf("trainer line %q: resumed from the wrong store", l)
			}
			res.total, first = at(t), true
			continue
		}
		if rest, ok := strings.CutPrefix(l, "bench: cpu "); ok {
			var tr, ag, pid, busy, tot int64
			if _, err := fmt.Sscanf(rest, "trainer %d agent %d agent_pid %d busy %d total %d", &tr, &ag, &pid, &busy, &tot); err != nil {
				return res, fmt.Errorf("trainer line %q: %w", l, err)
			}
			if pid != int64(cmd.Process.Pid) {
				return res, fmt.Errorf("the trainer's parent is %d, not the agent (%d)", pid, cmd.Process.Pid)
			}
			tick := func(v int64) float64 { return float64(v) / proc.ClkTck }
			res.cpu["agent"], res.cpu["trainer"] = tick(ag), tick(tr)
			res.cpu["others"] = max(0, tick(busy-busy0)-tick(ag)-tick(tr))
			res.cpu["idle"] = max(0, float64(runtime.NumCPU())*res.total-tick(busy-busy0))
			cpu = true
			continue
		}
		var e struct {
			Msg  string `json:"msg"`
			TS   string `json:"ts"`
			Took any    `json:"took"`
		}
		if json.Unmarshal([]byte(l), &e) != nil || e.Msg == "" {
			continue
		}
		ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", e.TS)
		if err != nil {
			continue
		}
		t := at(float64(ts.UnixNano()) / 1e9)
		if _, ok := res.marks["log"]; !ok {
			res.marks["log"] = t
		}
		key := map[string]string{"child started": "child", "trainer started": "loop", "trainer guard started": "guard", "connection accepted": "accepted",
			"trainer connected": "welcome", "restored checkpoint": "restore_end"}[e.Msg]
		if key != "" {
			if _, ok := res.marks[key]; !ok {
				res.marks[key] = t
			}
		}
		if e.Msg == "restored checkpoint" {
			switch v := e.Took.(type) {
			case float64:
				res.restore = v
			case string:
				if d, err := time.ParseDuration(v); err == nil {
					res.restore = d.Seconds()
				}
			}
			res.marks["restore_start"] = t - res.restore
		}
	}
	if !first || !cpu {
		return res, fmt.Errorf("no first step in the trainer's output:\n%s", proc.Tail(out.String(), 3000))
	}
	if storeDir != filepath.Join(work, "empty") && res.restore == 0 {
		return res, fmt.Errorf("no restore time in the agent's log:\n%s", proc.Tail(out.String(), 3000))
	}
	if oc.mode != "torch" {
		delete(res.marks, "imported")
	}
	return res, nil
}

// procCPU is every live process's CPU ticks (utime+stime) by pid, and its
// command name.
type procCPU map[int]struct {
	comm  string
	ticks int64
}

func readProcCPU() procCPU {
	out := procCPU{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i || len(s) < j+2 {
			continue
		}
		f := strings.Fields(s[j+2:])
		if len(f) < 15 {
			continue
		}
		var t int64
		for _, k := range f[11:15] { // utime, stime, and of its reaped children cutime, cstime
			v, _ := strconv.ParseInt(k, 10, 64)
			t += v
		}
		out[pid] = struct {
			comm  string
			ticks int64
		}{s[i+1 : j], t}
	}
	return out
}

// topCPU is the CPU seconds each command (by name) used from before to
// after, its reaped children's included, the n largest first: processes
// alive at after (one that ended meanwhile counts in its parent's), a
// process started meanwhile with all its time.
func topCPU(before, after procCPU, n int) string {
	by := map[string]int64{}
	for pid, a := range after {
		d := a.ticks
		if b, ok := before[pid]; ok && b.comm == a.comm {
			d -= b.ticks
		}
		if d > 0 {
			by[a.comm] += d
		}
	}
	names := make([]string, 0, len(by))
	for k := range by {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return by[names[i]] > by[names[j]] })
	var parts []string
	for _, k := range names[:min(n, len(names))] {
		parts = append(parts, fmt.Sprintf("%s %.1f s", k, float64(by[k])/proc.ClkTck))
	}
	return strings.Join(parts, ", ")
}
