package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// countingStore counts the bytes read through Get and the checkpoint files
// read to their end, for a progress display. The transfer pays one atomic
// add per read; the display samples the counters on its own clock.
type countingStore struct {
	cloud.Store
	bytes atomic.Int64
	files atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	r, err := s.Store.Get(ctx, key, offset, length)
	if err != nil {
		return r, err
	}
	if !isData(key) {
		return r, nil // latest.json, manifests: not what the user waits for
	}
	return &countedReader{ReadCloser: r, s: s, file: offset == 0}, nil
}

// isData reports whether key is a file of a checkpoint.
func isData(key string) bool {
	return strings.HasPrefix(key, "checkpoints/") && path.Base(key) != "manifest.json"
}

type countedReader struct {
	io.ReadCloser
	s    *countingStore
	file bool // a whole file from its start: counts as a file at EOF
	eof  bool
}

func (r *countedReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	r.s.bytes.Add(int64(n))
	if err == io.EOF && r.file && !r.eof {
		r.eof = true
		r.s.files.Add(1)
	}
	return n, err
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressEvery is how often a transfer that is not on a terminal logs its
// progress.
var progressEvery = 5 * time.Second

// showProgress displays what passes through st until the returned stop is
// called: a live bar (bytes, files, rate, ETA) when out is a terminal,
// else a structured log line on log every progressEvery. total and files
// are what is expected, 0 when unknown.
func showProgress(st *countingStore, what string, total int64, files int, out io.Writer, log *zap.Logger) (stop func()) {
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if !isTerminal(out) {
		wg.Go(func() {
			t := time.NewTicker(progressEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					logProgress(log, what, st, total, files, time.Since(start))
				}
			}
		})
		return func() {
			cancel()
			wg.Wait()
			if took := time.Since(start); took >= progressEvery { // it was long: close the series
				logProgress(log, what, st, total, files, took)
			}
		}
	}
	p := mpb.New(mpb.WithOutput(out), mpb.WithWidth(32), mpb.WithRefreshRate(200*time.Millisecond))
	barTotal := total
	if barTotal <= 0 {
		barTotal = 1 << 62 // unknown: the bar completes at the end
	}
	bar := p.New(barTotal, mpb.BarStyle(),
		mpb.PrependDecorators(decor.Name(what+" "), decor.CountersKibiByte("% .1f / % .1f")),
		mpb.AppendDecorators(
			decor.Any(func(decor.Statistics) string {
				if files > 0 {
					return fmt.Sprintf(" %d/%d files ", st.files.Load(), files)
				}
				return fmt.Sprintf(" %d files ", st.files.Load())
			}),
			decor.AverageSpeed(decor.SizeB1024(0), "% .1f"),
			decor.Name(" ETA "), decor.AverageETA(decor.ET_STYLE_GO),
		))
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				bar.SetCurrent(st.bytes.Load())
				bar.SetTotal(-1, true) // done: the total is what was read
				return
			case <-t.C:
				bar.SetCurrent(min(st.bytes.Load(), barTotal))
			}
		}
	})
	return func() { cancel(); wg.Wait(); p.Wait() }
}

func logProgress(log *zap.Logger, what string, st *countingStore, total int64, files int, took time.Duration) {
	done := st.bytes.Load()
	rate := float64(done) / took.Seconds()
	fields := []zap.Field{zap.Int64("bytes", done), zap.Int64("total", total),
		zap.Int64("files", st.files.Load()), zap.Int("total_files", files), zap.Float64("mb_per_s", rate/1e6)}
	if rate > 0 && total > done {
		fields = append(fields, zap.Duration("eta", time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second)))
	}
	log.Info(what+" progress", fields...)
}

// busyAfter is how long a read of a store runs before it says it is busy.
var busyAfter = time.Second

// busy shows, once a command has run for busyAfter, that it is still
// reading: a spinner with the time taken on a terminal (removed when
// done), else a log line every progressEvery. stop ends it.
func busy(out io.Writer, what string, log *zap.Logger) (stop func()) {
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(busyAfter):
		}
		if !isTerminal(out) {
			t := time.NewTicker(progressEvery)
			defer t.Stop()
			for {
				log.Info(what, zap.Float64("elapsed_s", time.Since(start).Round(time.Second).Seconds()))
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}
		p := mpb.New(mpb.WithOutput(out), mpb.WithWidth(1), mpb.WithRefreshRate(200*time.Millisecond))
		bar := p.New(0, mpb.SpinnerStyle(), mpb.BarRemoveOnComplete(),
			mpb.PrependDecorators(decor.Name(what+" ")), mpb.AppendDecorators(decor.Elapsed(decor.ET_STYLE_GO)))
		<-ctx.Done()
		bar.Abort(true)
		p.Wait()
	})
	return func() { cancel(); wg.Wait() }
}
