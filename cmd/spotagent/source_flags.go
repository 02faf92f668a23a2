package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/detect"
)

// sourceOptions choose and tune the notice source.
type sourceOptions struct {
	cloud string
	cfg   detect.Config
}

// clouds are the values of --cloud (detect.Open's names).
var clouds = []string{"auto", "aws", "gcp", "azure", "none"}

func (o *sourceOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.cloud, "cloud", "auto", "where notices come from: auto, aws, gcp, azure or none")
	fs.DurationVar(&o.cfg.PollInterval, "poll-interval", time.Second, "metadata poll interval (AWS, Azure; GCP uses hanging GETs)")
	fs.DurationVar(&o.cfg.AWSSpotPollInterval, "aws-spot-poll-interval", 250*time.Millisecond, "poll interval of AWS spot/instance-action (at most --poll-interval)")
	fs.StringVar(&o.cfg.AWSEndpoint, "aws-imds-endpoint", "", "AWS IMDS endpoint (default from AWS_EC2_METADATA_SERVICE_ENDPOINT)")
	fs.StringVar(&o.cfg.GCPHost, "gcp-metadata-host", "", "GCE metadata host:port (default from GCE_METADATA_HOST)")
	fs.StringVar(&o.cfg.AzureEndpoint, "azure-metadata-endpoint", "", "Azure IMDS endpoint (default http://169.254.169.254)")
	inGroup(fs, groupNotices, "cloud", "poll-interval", "aws-spot-poll-interval", "aws-imds-endpoint", "gcp-metadata-host", "azure-metadata-endpoint")
}

// check validates the flags without touching the network.
func (o *sourceOptions) check() error {
	if !slices.Contains(clouds, o.cloud) {
		return fmt.Errorf("--cloud %q: want auto, aws, gcp, azure or none", o.cloud)
	}
	if o.cfg.PollInterval < 0 || o.cfg.AWSSpotPollInterval < 0 {
		return fmt.Errorf("--poll-interval and --aws-spot-poll-interval must not be negative")
	}
	return nil
}

// open returns the source and the machine's identity. An identity that
// cannot be read is logged and left partial: notices matter more.
func (o *sourceOptions) open(ctx context.Context, log *zap.Logger) (metadata.Source, metadata.Identity, error) {
	src, err := detect.Open(ctx, o.cloud, o.cfg, log)
	if err != nil {
		return nil, metadata.Identity{}, err
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	id, err := src.Identity(ictx)
	if err != nil {
		log.Warn("could not read the machine's identity", zap.String("cloud", string(src.Cloud())), zap.Error(err))
		id = metadata.Identity{Cloud: src.Cloud()}
	}
	return src, id, nil
}
