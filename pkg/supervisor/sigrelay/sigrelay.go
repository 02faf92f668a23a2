// Package sigrelay is the agent's signals before its loop reads them: a
// SIGTERM/SIGINT cancels the start-up (Start, StartCancelled), and the
// loop turns one into a shutdown notice (Notice).
package sigrelay

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"go.uber.org/zap"
)

// Start lets SIGTERM/SIGINT cancel the agent's start (the lease,
// the journal read, the restore, which a slow or silent store can hold
// up for long) before the loop reads signals itself. ctx is cancelled by
// the first signal that arrives while starting; started ends the start:
// it returns the signal that cancelled it (nil: none), and from then on
// every signal goes to the returned channel, for the loop. stop ends the
// relay (the agent's Run returns).
func Start(parent context.Context, signals <-chan os.Signal, log *zap.Logger) (ctx context.Context, loop <-chan os.Signal, started func() os.Signal, stop func()) {
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(parent)
	out := make(chan os.Signal, 4)
	done, ended := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	starting := true
	var got os.Signal
	go func() {
		defer close(ended)
		for {
			var s os.Signal
			select {
			case <-done:
				return
			case s = <-signals:
			}
			mu.Lock()
			if starting {
				if got == nil {
					got = s
					log.Warn("signal during start-up: cancelling it (the trainer is not started)", zap.String("signal", s.String()))
					cancel()
				}
				mu.Unlock()
				continue
			}
			mu.Unlock()
			select {
			case out <- s:
			case <-done:
				return
			}
		}
	}()
	return ctx, out, func() os.Signal {
			mu.Lock()
			defer mu.Unlock()
			starting = false
			return got
		}, func() {
			close(done)
			<-ended
		}
}

// StartCancelled is the agent's answer to a signal during start-up: the exit
// code a shell gives for that signal (143 for SIGTERM, 130 for SIGINT).
func StartCancelled(s os.Signal) (int, error) {
	code := 1
	if sig, ok := s.(syscall.Signal); ok {
		code = 128 + int(sig)
	}
	return code, fmt.Errorf("start-up cancelled by %s", s)
}

// Notice turns SIGTERM/SIGINT into a shutdown notice.
func Notice(sig os.Signal, grace time.Duration) metadata.Notice {
	now := time.Now()
	name := sig.String()
	if s, ok := sig.(syscall.Signal); ok && s == syscall.SIGTERM {
		name = "SIGTERM"
	}
	return metadata.Notice{Cloud: metadata.CloudSignal, Kind: metadata.KindTermination, ID: "signal-" + name,
		Deadline: now.Add(grace), Detected: now, Action: name}
}
