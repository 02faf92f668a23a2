package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// testHookRestoreStore, when set, wraps the store `restore` reads (a test
// stalls the download with it).
var testHookRestoreStore func(cloud.Store) cloud.Store

// signalContext is ctx cancelled by the first SIGINT or SIGTERM; caught
// returns that signal (nil: none). stop ends the catching.
func signalContext(ctx context.Context) (_ context.Context, caught func() os.Signal, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var (
		mu  sync.Mutex
		got os.Signal
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case s := <-sigs:
			mu.Lock()
			got = s
			mu.Unlock()
			cancel()
		case <-ctx.Done():
		}
	}()
	caught = func() os.Signal {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	stop = func() {
		signal.Stop(sigs)
		cancel()
		<-done
	}
	return ctx, caught, stop
}

// signalExit is the exit of a command a signal cut short: 128+N, as a
// shell reports a process killed by signal N, with the message printed.
type signalExit struct {
	sig os.Signal
	err error
}

func (e signalExit) Error() string { return e.err.Error() }
func (e signalExit) Unwrap() error { return e.err }

func (e signalExit) code() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// removeStaleStages removes what restores into dest that were killed or
// interrupted left: their staging directories, named by
// restore.Dir ".<dest>.restore-<digits>" beside dest, or
// ".spotagent-restore-<digits>" inside a dest that is a mount point, and
// the partial downloads in them. Only directories of this user are
// touched, never through a symlink. A restore into the same dest running
// at the same time is not supported (the two would swap into one place).
func removeStaleStages(dest string, log *zap.Logger) {
	dest = filepath.Clean(dest)
	for _, loc := range []struct{ dir, prefix string }{
		{filepath.Dir(dest), "." + filepath.Base(dest) + ".restore-"},
		{dest, ".spotagent-restore-"},
	} {
		entries, err := os.ReadDir(loc.dir)
		if err != nil {
			continue // no dest yet, or its parent unreadable: RestoreDir says so
		}
		for _, e := range entries {
			suffix, ok := strings.CutPrefix(e.Name(), loc.prefix)
			if !ok || suffix == "" || strings.Trim(suffix, "0123456789") != "" || !e.IsDir() {
				continue
			}
			p := filepath.Join(loc.dir, e.Name())
			fi, err := os.Lstat(p)
			if err != nil || !fi.IsDir() {
				continue
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				log.Warn("restore: could not remove what an earlier restore left", zap.String("path", p), zap.Error(err))
				continue
			}
			log.Info("restore: removed what an earlier, interrupted restore left", zap.String("path", p))
		}
	}
}

// interrupted is the error of a restore a signal cut short.
func interrupted(s os.Signal, dest string) error {
	name := s.String()
	switch s {
	case os.Interrupt:
		name = "SIGINT"
	case syscall.SIGTERM:
		name = "SIGTERM"
	}
	return signalExit{sig: s, err: fmt.Errorf("interrupted by %s: nothing restored into %s; the partial download was removed", name, dest)}
}
