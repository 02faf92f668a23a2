package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// cmdWatch prints the machine's identity (to the log, stderr) and every
// interruption notice as one JSON line on stdout, until SIGINT/SIGTERM.
func cmdWatch(args []string) int {
	fs := newFlagSet("watch")
	var so sourceOptions
	so.register(fs)
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	log, err := newLogger("console", *level) // stderr: stdout is for the notices
	if err != nil {
		fmt.Fprintln(os.Stderr, "spotagent watch:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	src, id, err := so.open(ctx, log) // an unreadable identity is logged there
	if err != nil {
		log.Error("open metadata source", zap.Error(err))
		return 2
	}
	log.Info("identity", zap.Any("identity", id))

	notices := make(chan metadata.Notice, 16)
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx, notices) }()
	enc := json.NewEncoder(os.Stdout)
	for {
		select {
		case n := <-notices:
			if err := enc.Encode(n); err != nil {
				log.Error("write notice", zap.Error(err))
				return 1
			}
		case err := <-done:
			if err != nil {
				log.Error("watch", zap.Error(err))
				return 1
			}
			return 0
		}
	}
}
