package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/idlegc"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// newWatchCmd prints the machine's identity (to the log, stderr) and every
// interruption notice as one JSON line on stdout, until SIGINT/SIGTERM.
func newWatchCmd() *cobra.Command {
	var so sourceOptions
	var level string
	cmd := &cobra.Command{
		Use:     "watch",
		Short:   "print interruption notices as JSON lines",
		Example: "spotagent watch --cloud aws",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return exit(watchNotices(cmd, &so, level))
		},
	}
	so.register(cmd.Flags())
	cmd.Flags().StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	inGroup(cmd.Flags(), groupOutput, "log-level")
	completeWords(cmd, "cloud", clouds...)
	return cmd
}

func watchNotices(cmd *cobra.Command, so *sourceOptions, level string) int {
	if err := so.check(); err != nil {
		return failCode(cmd, usageError{err})
	}
	if so.cloud == string(metadata.CloudNone) {
		return failCode(cmd, usageError{fmt.Errorf("--cloud none: no metadata service to watch, so no notice could ever print; use auto, aws, gcp or azure")})
	}
	log, err := newLogger("console", level) // stderr: stdout is for the notices
	if err != nil {
		return failCode(cmd, usageError{err})
	}
	defer func() { _ = log.Sync() }()
	defer idlegc.Start()() // a smaller heap while it polls

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	src, id, err := so.open(ctx, log) // an unreadable identity is logged there
	if err != nil {
		log.Error("open metadata source", zap.Error(err))
		return 2
	}
	if src.Cloud() == metadata.CloudNone {
		// --cloud auto found no metadata service: say so rather than wait
		// in silence for a notice that cannot come.
		log.Error("no cloud metadata service answered: not a cloud machine, or the metadata address is blocked; nothing to watch")
		return 1
	}
	log.Info("identity", zap.Any("identity", id))

	notices := make(chan metadata.Notice, 16)
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx, notices) }()
	enc := json.NewEncoder(cmd.OutOrStdout())
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
