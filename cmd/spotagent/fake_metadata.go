package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// newFakeMetadataCmd serves a fake cloud metadata service until
// SIGINT/SIGTERM. It prints the export line that points spotagent at it on
// stdout.
func newFakeMetadataCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "fake-metadata",
		Short:   "serve a fake cloud metadata service for demos and tests",
		Example: "spotagent fake-metadata --cloud aws --notice-after 2m",
		Args:    cobra.NoArgs,
	}
	fs := cmd.Flags()
	cloud := fs.String("cloud", "aws", "which metadata service to fake: aws, gcp or azure")
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0 picks a free one)")
	after := fs.Duration("notice-after", 0, "expose a termination notice after this long (0: never)")
	faultName := fs.String("fault", "none", "misbehave from the start: none, 5xx, hang, garbage, html, 401, refused, status")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	completeWords(cmd, "cloud", "aws", "gcp", "azure")
	completeWords(cmd, "fault", "none", "5xx", "hang", "garbage", "html", "401", "refused", "status")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return exit(serveFakeMetadata(cmd, *cloud, *addr, *after, *faultName, *level))
	}
	return cmd
}

func serveFakeMetadata(cmd *cobra.Command, cloud, addr string, after time.Duration, faultName, level string) int {
	log, err := newLogger("console", level)
	if err != nil {
		return failCode(cmd, usageError{err})
	}
	defer func() { _ = log.Sync() }()
	fault, err := fake.ParseFault(faultName)
	if err != nil {
		log.Error("--fault", zap.Error(err))
		return 2
	}

	srv, err := fake.Start(cloud, addr)
	if err != nil {
		log.Error("start fake metadata service", zap.Error(err))
		return 1
	}
	defer srv.Close()
	srv.SetFault(fault)
	name, value := srv.Env()
	fmt.Fprintf(cmd.OutOrStdout(), "export %s=%s\n", name, value)
	log.Info("serving fake metadata", zap.String("cloud", cloud), zap.String("url", srv.URL()),
		zap.String("fault", fault.String()), zap.Duration("notice_after", after))
	if after > 0 {
		t := time.AfterFunc(after, func() {
			log.Info("notice exposed", zap.Time("at", srv.Notice()))
		})
		defer t.Stop()
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	log.Info("stopping", zap.String("signal", (<-sig).String()))
	return 0
}
