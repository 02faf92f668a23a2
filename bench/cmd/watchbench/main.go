// Command watchbench measures zero-code mode and restore (issue 27):
//
//	go run ./bench/cmd/watchbench idle -files 100000        # watcher CPU, idle and while a checkpoint is written
//	go run ./bench/cmd/watchbench restore-rss -manifests 50 -mib 50
//	go run ./bench/cmd/watchbench notice -bin bin/spotagent -save 10s -notice 30s
//
// notice: spotagent run --watch (no --notice-signal) with a shell trainer
// that trains 10 steps a second and saves an HF layout checkpoint every
// -save, rotating (save_total_limit=1); a spot notice from the fake AWS
// metadata server, -notice ahead, comes -after the start. It reports the
// steps the trainer had trained when it was stopped, the step committed,
// and the difference: the steps lost.
//
// idle: DIR holds 100 checkpoint-<N> directories (HF layout, with
// trainer_state.json) of files/100 small files each. A watch.Watcher runs
// (as the agent runs it) until all are reported complete; then its process
// CPU time is measured over -idle (default 30 s) with nothing written, and
// over the writing of one more checkpoint of files/100 files at 100 files/s.
//
// restore-rss: a store (in this process, nothing on disk) holds -manifests
// manifests of about -mib MiB each (the bytes are generated as they are
// read), none of which restores (their objects are missing): restore reads
// every one, newest first. The process's peak RSS (VmHWM) is reported.
//
// It prints one line per figure, or with -json one JSON object per
// subcommand (what `make bench` reads: bench/cmd/spotbench/watch.go). It is
// not a test: nothing here runs in make test.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/watch"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: watchbench idle|restore-rss|notice [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "idle":
		err = idle(os.Args[2:])
	case "restore-rss":
		err = restoreRSS(os.Args[2:])
	case "notice":
		err = notice(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "watchbench:", err)
		os.Exit(1)
	}
}

// emit prints the figures as one JSON object when asked to, else the line.
func emit(asJSON bool, figures any, format string, args ...any) {
	if asJSON {
		b, _ := json.Marshal(figures)
		fmt.Println(string(b))
		return
	}
	fmt.Printf(format, args...)
}

func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func writeCheckpoint(dir string, step, files int, pace time.Duration) error {
	d := filepath.Join(dir, "checkpoint-"+strconv.Itoa(step))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("shard-%05d.bin", i)), []byte("x"), 0o644); err != nil {
			return err
		}
		if pace > 0 {
			time.Sleep(pace)
		}
	}
	return os.WriteFile(filepath.Join(d, watch.HFMarker), []byte("{}"), 0o644)
}

func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	files := fs.Int("files", 100000, "files in DIR")
	idleFor := fs.Duration("idle", 30*time.Second, "idle measurement")
	work := fs.String("work", "", "scratch directory (default: a temporary one)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Parse(args)
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "watchbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	const ckpts = 100
	per := *files / ckpts
	for i := 1; i <= ckpts; i++ {
		if err := writeCheckpoint(dir, i*10, per, 0); err != nil {
			return err
		}
	}
	w, err := watch.New(watch.Config{Dir: dir})
	if err != nil {
		return err
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *watch.Checkpoint, ckpts+16)
	t0 := time.Now()
	go w.Run(ctx, out)
	for n := 0; n < ckpts; n++ {
		select {
		case <-out:
		case <-time.After(5 * time.Minute):
			return fmt.Errorf("only %d of %d checkpoints reported", n, ckpts)
		}
	}
	first := time.Since(t0)
	if !*asJSON {
		fmt.Printf("watch: %d files in %d checkpoints: all complete after %s (first scan)\n", ckpts*per, ckpts, first.Round(time.Millisecond))
	}
	runtime.GC()
	c0, w0 := cpu(), time.Now()
	time.Sleep(*idleFor)
	c1, w1 := cpu(), time.Now()
	idlePct := 100 * float64(c1-c0) / float64(w1.Sub(w0))
	if !*asJSON {
		fmt.Printf("watch idle: %.2f %% of a core over %s with %d files\n", idlePct, w1.Sub(w0).Round(time.Second), ckpts*per)
	}
	if err := writeCheckpoint(dir, (ckpts+1)*10, per, 10*time.Millisecond); err != nil {
		return err
	}
	select {
	case <-out:
	case <-time.After(time.Minute):
		return errors.New("the new checkpoint was not reported")
	}
	c2, w2 := cpu(), time.Now()
	writingPct := 100 * float64(c2-c1) / float64(w2.Sub(w1))
	emit(*asJSON, map[string]any{"files": ckpts * per, "checkpoints": ckpts, "first_scan_s": first.Seconds(),
		"idle_s": w1.Sub(w0).Seconds(), "idle_cpu_pct": idlePct, "writing_files": per, "writing_s": w2.Sub(w1).Seconds(), "writing_cpu_pct": writingPct},
		"watch writing: %.2f %% of a core while a checkpoint of %d files was written (%s, until reported complete)\n",
		writingPct, per, w2.Sub(w1).Round(time.Millisecond))
	return nil
}

// genStore serves n generated manifests, each listing files entries so
// that it is about mib MiB; every data object is missing.
type genStore struct {
	cloud.Store
	n, files int
}

func (s *genStore) key(i int) string {
	return checkpoint.ManifestKey(int64(i*10), fmt.Sprintf("m%d", i))
}

func (s *genStore) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	for i := 1; i <= s.n; i++ {
		if err := fn(cloud.ObjectInfo{Key: s.key(i)}); err != nil {
			return err
		}
	}
	return nil
}

func (s *genStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	for i := 1; i <= s.n; i++ {
		if key == s.key(i) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(s.write(pw, i)) }()
			return pr, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", key, cloud.ErrNotExist)
}

func (s *genStore) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	return cloud.ObjectInfo{}, fmt.Errorf("%s: %w", key, cloud.ErrNotExist)
}

func (s *genStore) URI(key string) string { return "gen://" + key }
func (s *genStore) Close() error          { return nil }

func (s *genStore) write(w io.Writer, i int) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	step, id := i*10, fmt.Sprintf("m%d", i)
	prefix := strings.TrimSuffix(checkpoint.Prefix(int64(step), id), "/")
	fmt.Fprintf(bw, `{"format":%q,"run_id":"bench","id":%q,"step":%d,"reason":"periodic","created":"2026-01-01T00:00:00Z","source":{"cloud":"none"},"files":[`,
		checkpoint.Format, id, step)
	sum := strings.Repeat("ab", 32)
	for f := range s.files {
		if f > 0 {
			bw.WriteByte(',')
		}
		fmt.Fprintf(bw, `{"path":"model/shard-%07d.safetensors","key":"%s/model/shard-%07d.safetensors","size":%d,"sha256":%q}`, f, prefix, f, 1000+f, sum)
	}
	bw.WriteString("]}")
	return bw.Flush()
}

// peakRSS is this process's VmHWM in bytes (-1: unknown).
func peakRSS() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return -1
}

func restoreRSS(args []string) error {
	fs := flag.NewFlagSet("restore-rss", flag.ExitOnError)
	manifests := fs.Int("manifests", 50, "manifests in the store")
	mib := fs.Int("mib", 50, "size of each manifest, MiB")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Parse(args)
	// One entry is about 190 bytes.
	st := &genStore{n: *manifests, files: *mib << 20 / 190}
	dest, err := os.MkdirTemp("", "watchbench-restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dest)
	t0 := time.Now()
	_, err = restore.Checkpoint(context.Background(), st, dest, restore.Options{})
	if !errors.Is(err, restore.ErrAllDamaged) {
		return fmt.Errorf("restore: %v, want every checkpoint damaged", err)
	}
	took, rss := time.Since(t0), peakRSS()
	emit(*asJSON, map[string]any{"manifests": *manifests, "mib": *mib, "files": st.files, "seconds": took.Seconds(), "peak_rss_bytes": rss},
		"restore: %d manifests of ~%d MiB (%d files each), all tried newest first: %s, peak RSS %.1f MB\n",
		*manifests, *mib, st.files, took.Round(time.Millisecond), float64(rss)/1e6)
	return nil
}

func notice(args []string) error {
	fs := flag.NewFlagSet("notice", flag.ExitOnError)
	bin := fs.String("bin", "bin/spotagent", "spotagent binary")
	save := fs.Duration("save", 10*time.Second, "the trainer's save period")
	lead := fs.Duration("notice", 30*time.Second, "notice lead time")
	after := fs.Duration("after", 25*time.Second, "notice this long after the start")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Parse(args)
	work, err := os.MkdirTemp("", "watchbench-notice-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	aws, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
	if err != nil {
		return err
	}
	defer aws.Close()
	out := filepath.Join(work, "out")
	every := int(save.Seconds() * 10) // steps between saves, at 10 steps/s
	script := fmt.Sprintf(`trap 'echo "stopped at step $i"; exit 143' TERM; i=0; while :; do sleep 0.1; i=$((i+1)); `+
		`if [ $((i %% %d)) -eq 0 ]; then d="$OUT/checkpoint-$i"; mkdir -p "$d"; head -c 1048576 /dev/urandom > "$d/pytorch_model.bin"; `+
		`echo "{\"global_step\": $i}" > "$d/trainer_state.json"; rm -rf "$OUT/checkpoint-$((i-%d))"; fi; done`, every, every)
	cmd := exec.Command(*bin, "run", "--store", "file://"+filepath.Join(work, "store"), "--run-id", "bench", "--watch", out,
		"--cloud", "aws", "--aws-imds-endpoint", aws.URL(), "--checkpoint-dir", filepath.Join(work, "ckpt"),
		"--socket", filepath.Join(work, "a.sock"), "--log-level", "info", "--", "/usr/bin/env", "OUT="+out, "/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return err
	}
	time.Sleep(*after)
	noticeAt := time.Now()
	aws.Terminate("terminate", noticeAt.Add(*lead))
	err = cmd.Wait()
	took := time.Since(noticeAt)
	st, oerr := file.New(filepath.Join(work, "store"))
	if oerr != nil {
		return oerr
	}
	j, jerr := journal.Read(context.Background(), st, "bench")
	if jerr != nil || len(j.Interruptions) != 1 {
		return fmt.Errorf("journal: %v (%v)\n%s", jerr, err, buf.String())
	}
	in := j.Interruptions[0]
	stopped := -1
	for _, l := range strings.Split(buf.String(), "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(l), "stopped at step "); ok {
			stopped, _ = strconv.Atoi(n)
		}
	}
	if stopped < 0 {
		return fmt.Errorf("the trainer did not say where it was stopped (%v)\n%s", err, buf.String())
	}
	emit(*asJSON, map[string]any{"notice_s": lead.Seconds(), "save_s": save.Seconds(), "save_steps": every, "stopped_after_s": took.Seconds(),
		"stopped_step": stopped, "committed_step": in.Step, "commit_ok": in.CommitOK, "lost_steps": int64(stopped) - in.Step,
		"journal_lost_steps": in.LostSteps, "journal_lost_steps_from": in.LostStepsFrom, "journal_lost_seconds": in.LostSeconds},
		"notice %s ahead, save every %s (%d steps): trainer stopped %s after the notice at step %d; committed step %d (ok %v); lost %d steps; journal lost_steps %d (%s), lost_seconds %.1f\n",
		*lead, *save, every, took.Round(100*time.Millisecond), stopped, in.Step, in.CommitOK, int64(stopped)-in.Step, in.LostSteps, in.LostStepsFrom, in.LostSeconds)
	return nil
}
