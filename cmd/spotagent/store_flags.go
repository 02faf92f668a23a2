package main

import (
	"context"
	"flag"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// storeOptions are the flags that tune the store backends.
type storeOptions struct {
	s3Endpoint    string
	s3PartSize    int64
	s3Concurrency int
	gcsChunkSize  int
}

func (o *storeOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.s3Endpoint, "s3-endpoint", "", "S3 endpoint URL (path-style addressing); default from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL")
	fs.Int64Var(&o.s3PartSize, "s3-part-size", 0, "S3 multipart part size in bytes (0: the backend's default)")
	fs.IntVar(&o.s3Concurrency, "s3-concurrency", 0, "S3 parts uploaded at once per file (0: the backend's default)")
	fs.IntVar(&o.gcsChunkSize, "gcs-chunk-size", 0, "GCS resumable upload chunk size in bytes (0: the backend's default)")
}

func (o *storeOptions) open(ctx context.Context, uri string, log *zap.Logger) (cloud.Store, error) {
	return all.Open(ctx, uri, all.Options{
		S3Endpoint: o.s3Endpoint, S3PartSize: o.s3PartSize, S3Concurrency: o.s3Concurrency,
		GCSChunkSize: o.gcsChunkSize, Log: log,
	})
}

// storeOnly registers just what list/restore/history need.
type storeOnly struct {
	uri string
	storeOptions
	logFormat, logLevel string
}

func (o *storeOnly) register(fs *flag.FlagSet) {
	fs.StringVar(&o.uri, "store", "", "the run's store: s3://bucket/prefix, gs://bucket/prefix, file:///dir or a path")
	o.storeOptions.register(fs)
	fs.StringVar(&o.logFormat, "log-format", "console", "log format: console or json")
	fs.StringVar(&o.logLevel, "log-level", "warn", "log level")
}

// storeCommand parses a store-only command's flags (more adds its own),
// opens the store and runs fn; errors become one line and exit code 1.
func storeCommand(name string, args []string, more func(fs *flag.FlagSet), fn func(ctx context.Context, st cloud.Store, log *zap.Logger) error) int {
	fs := newFlagSet(name)
	var o storeOnly
	o.register(fs)
	if more != nil {
		more(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	ctx := context.Background()
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return failf(name, err)
	}
	st, err := openStore(ctx, o.uri, o.storeOptions, log)
	if err != nil {
		return failf(name, err)
	}
	defer st.Close()
	if err := fn(ctx, st, log); err != nil {
		return failf(name, err)
	}
	return 0
}
