package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/detect"
)

// cmdWatch prints the machine's identity (to the log, stderr) and every
// interruption notice as one JSON line on stdout, until SIGINT/SIGTERM.
func cmdWatch(args []string) int {
	fs := newFlagSet("watch")
	cloud := fs.String("cloud", "auto", "where notices come from: auto, aws, gcp, azure or none")
	var cfg detect.Config
	fs.DurationVar(&cfg.PollInterval, "poll-interval", time.Second, "metadata poll interval (AWS, Azure; GCP uses hanging GETs)")
	fs.StringVar(&cfg.AWSEndpoint, "aws-imds-endpoint", "", "AWS IMDS endpoint (default from AWS_EC2_METADATA_SERVICE_ENDPOINT)")
	fs.StringVar(&cfg.GCPHost, "gcp-metadata-host", "", "GCE metadata host:port (default from GCE_METADATA_HOST)")
	fs.StringVar(&cfg.AzureEndpoint, "azure-metadata-endpoint", "", "Azure IMDS endpoint")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	log, err := watchLogger(*level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "spotagent watch:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	src, err := detect.Open(ctx, *cloud, cfg, log)
	if err != nil {
		log.Error("open metadata source", zap.Error(err))
		return 2
	}
	idCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	id, err := src.Identity(idCtx)
	cancel()
	if err != nil {
		log.Warn("identity", zap.String("cloud", string(src.Cloud())), zap.Error(err))
	} else {
		log.Info("identity", zap.Any("identity", id))
	}

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

// watchLogger logs to stderr, leaving stdout to the notices.
func watchLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeLevel = zapcore.CapitalLevelEncoder
	enc.ConsoleSeparator = " "
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), lvl)
	return zap.New(core).Named("spotagent"), nil
}
