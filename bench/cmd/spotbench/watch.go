package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/report"
)

// watchIdle is the idle window of the watcher figure: past a minute, so
// that it holds one of the watcher's full walks (pkg/watch fullRescan).
const watchIdle = 70 * time.Second

// watchSaveSteps is what the notice figure's trainer trains between
// saves: 10 steps a second, a save every 10 s (bench/cmd/watchbench).
const watchSaveSteps = 100

// benchWatch: zero-code mode (issue 27), through bench/cmd/watchbench run
// as a child process per figure, so that its CPU and peak RSS are its own:
// the watcher's CPU idle with 100,000 files in DIR, the restore's peak RSS
// over 50 manifests of 50 MiB, and the steps a trainer saving every 10 s
// loses at 30 s and 120 s notices (the real binary, no --notice-signal).
func benchWatch(c *config, r *report.Report) error {
	var idle struct {
		Files         int     `json:"files"`
		FirstScanS    float64 `json:"first_scan_s"`
		IdleS         float64 `json:"idle_s"`
		IdleCPUPct    float64 `json:"idle_cpu_pct"`
		WritingFiles  int     `json:"writing_files"`
		WritingS      float64 `json:"writing_s"`
		WritingCPUPct float64 `json:"writing_cpu_pct"`
	}
	logf("watch: 100,000 files, %s idle", watchIdle)
	if err := watchbench(c, &idle, "idle", "-files", "100000", "-idle", watchIdle.String()); err != nil {
		return err
	}
	var rst struct {
		Manifests    int     `json:"manifests"`
		MiB          int     `json:"mib"`
		Files        int     `json:"files"`
		Seconds      float64 `json:"seconds"`
		PeakRSSBytes int64   `json:"peak_rss_bytes"`
	}
	logf("watch: restore over 50 manifests of 50 MiB")
	if err := watchbench(c, &rst, "restore-rss", "-manifests", "50", "-mib", "50"); err != nil {
		return err
	}
	type noticeRun struct {
		NoticeS          float64 `json:"notice_s"`
		StoppedAfterS    float64 `json:"stopped_after_s"`
		StoppedStep      int64   `json:"stopped_step"`
		CommittedStep    int64   `json:"committed_step"`
		CommitOK         bool    `json:"commit_ok"`
		LostSteps        int64   `json:"lost_steps"`
		JournalLost      int64   `json:"journal_lost_steps"`
		JournalLostFrom  string  `json:"journal_lost_steps_from"`
		JournalLostSecsS float64 `json:"journal_lost_seconds"`
	}
	var notices []noticeRun
	for _, lead := range []time.Duration{30 * time.Second, 120 * time.Second} {
		logf("watch: a %s notice, a save every 10 s", lead)
		var n noticeRun
		if err := watchbench(c, &n, "notice", "-bin", c.bin, "-save", "10s", "-notice", lead.String()); err != nil {
			return err
		}
		notices = append(notices, n)
	}

	var b strings.Builder
	b.WriteString("`bench/cmd/watchbench`, one child process per figure (its CPU and VmHWM are its own).\n\n")
	b.WriteString("- *watcher*: DIR holds 100 Hugging Face `checkpoint-<N>` directories (with `trainer_state.json`) of 1,000 files each; a `watch.Watcher` runs as the agent runs it until all are reported complete (first scan), then its process CPU is measured over the idle window (one minute's full walk included) and while one more checkpoint of 1,000 files is written at 100 files/s.\n")
	b.WriteString("- *restore*: a store in the process serving 50 generated manifests of ~50 MiB, none restorable (their objects are missing), so restore reads every one, newest first, stream-decoding each.\n")
	b.WriteString("- *notice*: `spotagent run --watch` (file store, no `--notice-signal`) with a shell trainer at 10 steps/s saving a 1 MiB HF checkpoint every 10 s (100 steps) and rotating it (`save_total_limit=1`); a spot `terminate` from the AWS fake 25 s after the start. *lost* = the step the trainer printed on SIGTERM − the step committed; the journal's `lost_steps` is the agent's own count (`lost_steps_from: estimate`: the trainer's pace from its checkpoints, extrapolated to the stop).\n\n")
	b.WriteString("| figure | measured |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| watcher CPU idle, %d files, over %.0f s | %.2f %% of a core |\n", idle.Files, idle.IdleS, idle.IdleCPUPct)
	fmt.Fprintf(&b, "| watcher CPU while a checkpoint of %d files is written (%.1f s, until reported complete) | %.2f %% of a core |\n", idle.WritingFiles, idle.WritingS, idle.WritingCPUPct)
	fmt.Fprintf(&b, "| first scan, %d files, every checkpoint complete | %.1f s |\n", idle.Files, idle.FirstScanS)
	fmt.Fprintf(&b, "| restore, %d manifests of ~%d MiB (%d entries each), all read newest first | %.1f s, peak RSS %.0f MB |\n", rst.Manifests, rst.MiB, rst.Files, rst.Seconds, float64(rst.PeakRSSBytes)/1e6)
	b.WriteString("\n| notice | trainer stopped after | at step | committed | lost steps | journal `lost_steps` | `lost_steps_from` | journal `lost_seconds` |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, n := range notices {
		fmt.Fprintf(&b, "| %.0f s | %.1f s | %d | %d (ok %v) | %d | %d | %s | %.1f |\n", n.NoticeS, n.StoppedAfterS, n.StoppedStep, n.CommittedStep, n.CommitOK,
			n.LostSteps, n.JournalLost, orDash(n.JournalLostFrom), n.JournalLostSecsS)
	}
	r.Add("10. Zero-code mode (`--watch`): watcher, restore, lost steps (issue 27)", b.String())

	r.Target(report.Target{Name: "watcher idle CPU, 100,000 files in DIR", Want: "≤ 1 % of a core",
		Got: fmt.Sprintf("%.2f %%", idle.IdleCPUPct), Met: idle.IdleCPUPct <= 1, Margin: fmt.Sprintf("%+.2f points", 1-idle.IdleCPUPct)})
	mb := float64(rst.PeakRSSBytes) / 1e6
	r.Target(report.Target{Name: "restore peak RSS, 50 manifests of 50 MiB", Want: "≤ 200 MB",
		Got: fmt.Sprintf("%.0f MB", mb), Met: rst.PeakRSSBytes > 0 && mb <= 200, Margin: fmt.Sprintf("%+.0f MB", 200-mb)})
	// At most the steps since the last save that could still be uploaded:
	// the trainer runs to the upload deadline, so one save period, plus
	// the second the marker's quiet window and a 1 MiB upload take.
	bound := int64(watchSaveSteps + 10)
	for _, n := range notices {
		r.Target(report.Target{Name: fmt.Sprintf("steps lost at a %.0f s notice, a save every 10 s (100 steps)", n.NoticeS),
			Want: fmt.Sprintf("≤ %d (one save period + 1 s)", bound), Got: fmt.Sprintf("%d (journal: %d, %s)", n.LostSteps, n.JournalLost, orDash(n.JournalLostFrom)),
			Met: n.CommitOK && n.LostSteps <= bound, Margin: fmt.Sprintf("%+d steps", bound-n.LostSteps)})
	}
	r.Command("watchbench idle -files 100000 -idle 70s -json")
	r.Command("watchbench restore-rss -manifests 50 -mib 50 -json")
	r.Command("watchbench notice -bin spotagent -save 10s -notice 30s -json   # and -notice 120s")
	return nil
}

// watchbench runs one watchbench subcommand and decodes its JSON figures.
func watchbench(c *config, into any, args ...string) error {
	cmd := exec.Command(c.watchbench, append(args, "-json")...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("watchbench %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	if err := json.Unmarshal(out, into); err != nil {
		return fmt.Errorf("watchbench %s: %w: %q", args[0], err, out)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
