// Package detect opens the metadata source of the cloud spotagent runs on,
// by name or by probing the three metadata services at once.
package detect

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/aws"
	"github.com/spotagent/spotagent/pkg/metadata/azure"
	"github.com/spotagent/spotagent/pkg/metadata/gcp"
)

// Config carries every source's settings. Zero fields take each source's
// defaults, which honour the standard environment overrides.
type Config struct {
	AWSEndpoint   string // AWS_EC2_METADATA_SERVICE_ENDPOINT
	GCPHost       string // GCE_METADATA_HOST
	AzureEndpoint string // SPOTAGENT_AZURE_METADATA_ENDPOINT

	// PollInterval of the polling sources, AWS and Azure (1s).
	PollInterval time.Duration
	// AWSSpotPollInterval of AWS spot/instance-action (250ms, at most
	// PollInterval).
	AWSSpotPollInterval time.Duration
	// PreemptGrace: GCP preemption deadline after detection (30s).
	PreemptGrace time.Duration
	// MaintenanceGrace: GCP host maintenance deadline after detection (60s).
	MaintenanceGrace time.Duration
	// AzureGrace: Azure termination deadline when NotBefore is blank (30s).
	AzureGrace time.Duration
	// ProbeTimeout bounds auto-detection as a whole (1.5s).
	ProbeTimeout time.Duration
}

// prober is what auto-detection asks of a source.
type prober interface {
	metadata.Source
	Probe(ctx context.Context) error
}

// clouds lists the names Open accepts.
var clouds = []string{"auto", "aws", "gcp", "azure", "none"}

// Open returns the source for cloud: auto, aws, gcp, azure or none. With
// auto it probes the three metadata services concurrently, within
// ProbeTimeout, logs the choice and falls back to None when none answers.
func Open(ctx context.Context, cloud string, cfg Config, log *zap.Logger) (metadata.Source, error) {
	if log == nil {
		log = zap.NewNop()
	}
	srcs := sources(cfg, log)
	switch cloud {
	case "aws":
		return srcs[0], nil
	case "gcp":
		return srcs[1], nil
	case "azure":
		return srcs[2], nil
	case "none":
		return None{}, nil
	case "auto", "":
		return probe(ctx, cfg, srcs, log), nil
	}
	return nil, fmt.Errorf("unknown cloud %q (want auto, aws, gcp, azure or none)", cloud)
}

func sources(cfg Config, log *zap.Logger) []prober {
	return []prober{
		aws.New(aws.Config{Endpoint: cfg.AWSEndpoint, PollInterval: cfg.PollInterval, SpotPollInterval: cfg.AWSSpotPollInterval}, log),
		gcp.New(gcp.Config{Host: cfg.GCPHost, PreemptGrace: cfg.PreemptGrace, MaintenanceGrace: cfg.MaintenanceGrace}, log),
		azure.New(azure.Config{Endpoint: cfg.AzureEndpoint, PollInterval: cfg.PollInterval, DefaultGrace: cfg.AzureGrace}, log),
	}
}

// probe asks every source at once and returns the first that answers.
func probe(ctx context.Context, cfg Config, srcs []prober, log *zap.Logger) metadata.Source {
	timeout := cfg.ProbeTimeout
	if timeout <= 0 {
		timeout = 1500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		src prober
		err error
	}
	results := make(chan result, len(srcs))
	for _, s := range srcs {
		go func() { results <- result{s, s.Probe(ctx)} }()
	}
	start := time.Now()
	var errs []zap.Field
	for range srcs {
		r := <-results
		if r.err == nil {
			log.Info("detected cloud", zap.String("cloud", string(r.src.Cloud())), zap.Duration("took", time.Since(start)))
			return r.src
		}
		errs = append(errs, zap.NamedError(string(r.src.Cloud()), r.err))
	}
	log.Info("no cloud metadata service answered; watching nothing",
		append(errs, zap.String("cloud", "none"), zap.Duration("took", time.Since(start)))...)
	return None{}
}
