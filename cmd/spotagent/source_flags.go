package main

import (
	"context"
	"flag"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/detect"
)

// sourceOptions choose and tune the notice source.
type sourceOptions struct {
	cloud string
	cfg   detect.Config
}

func (o *sourceOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.cloud, "cloud", "auto", "where notices come from: auto, aws, gcp, azure or none")
	fs.DurationVar(&o.cfg.PollInterval, "poll-interval", time.Second, "metadata poll interval (AWS, Azure; GCP uses hanging GETs)")
	fs.DurationVar(&o.cfg.AWSSpotPollInterval, "aws-spot-poll-interval", 250*time.Millisecond, "poll interval of AWS spot/instance-action (at most --poll-interval)")
	fs.StringVar(&o.cfg.AWSEndpoint, "aws-imds-endpoint", "", "AWS IMDS endpoint (default from AWS_EC2_METADATA_SERVICE_ENDPOINT)")
	fs.StringVar(&o.cfg.GCPHost, "gcp-metadata-host", "", "GCE metadata host:port (default from GCE_METADATA_HOST)")
	fs.StringVar(&o.cfg.AzureEndpoint, "azure-metadata-endpoint", "", "Azure IMDS endpoint (default http://169.254.169.254)")
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
