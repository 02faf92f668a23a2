package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/wrap"
)

// storeOptions are the flags that tune the store backends (run, sidecar,
// node: the agent uploads).
type storeOptions struct {
	s3Endpoint    string
	s3PartSize    int64
	s3Concurrency int
	gcsChunkSize  int
	observer      wrap.Observer // the agent's metrics, when served
}

func (o *storeOptions) register(fs *pflag.FlagSet) {
	registerS3Endpoint(fs, &o.s3Endpoint)
	fs.Int64Var(&o.s3PartSize, "s3-part-size", 0, "S3 multipart part size in bytes (0: the backend's default)")
	fs.IntVar(&o.s3Concurrency, "s3-concurrency", 0, "S3 parts uploaded at once per file (0: the backend's default)")
	fs.IntVar(&o.gcsChunkSize, "gcs-chunk-size", 0, "GCS resumable upload chunk size in bytes (0: the backend's default)")
	inGroup(fs, groupStore, "s3-part-size", "s3-concurrency", "gcs-chunk-size")
}

func registerS3Endpoint(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "s3-endpoint", "", "S3 endpoint URL (path-style addressing); default from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL")
	inGroup(fs, groupStore, "s3-endpoint")
}

// openStore opens the store for the agent and checks it is reachable, so
// that a bad URI or credentials fail before any trainer starts.
func (o *storeOptions) openStore(ctx context.Context, uri string, log *zap.Logger) (cloud.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return all.Open(ctx, uri, all.Options{ // its errors name the store
		S3Endpoint: o.s3Endpoint, S3PartSize: o.s3PartSize, S3Concurrency: o.s3Concurrency,
		GCSChunkSize: o.gcsChunkSize, Log: log, Observer: o.observer,
	})
}

// readOptions are the flags of a command that only reads a store: list,
// history, report, restore.
type readOptions struct {
	uri, s3Endpoint     string
	logFormat, logLevel string
}

func (o *readOptions) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.uri, "store", "", "the run's store: s3://bucket/prefix, gs://bucket/prefix, az://container[@account]/prefix, file:///dir or a path")
	registerS3Endpoint(fs, &o.s3Endpoint)
	fs.StringVar(&o.logFormat, "log-format", "console", "log format: console or json")
	fs.StringVar(&o.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	inGroup(fs, groupRequired, "store")
	inGroup(fs, groupStoreURI, "s3-endpoint")
	inGroup(fs, groupOutput, "log-format", "log-level")
	completeWords(cmd, "log-format", "console", "json")
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
}

// errNoRun is a store that exists and holds nothing: a mistyped prefix
// looks like that, so it is an error, not an empty listing.
var errNoRun = errors.New("holds nothing: no run has used this store (check --store)")

// run checks the flags (check, then the store's), opens the store
// read-only and runs fn. Nothing is ever created in the store; a store
// that does not exist or holds nothing is an error naming it. Errors
// print one line; the exit code is 2 for bad usage, else 1.
func (o *readOptions) run(cmd *cobra.Command, check func() error, fn func(ctx context.Context, st cloud.Store, log *zap.Logger) error) error {
	if o.uri == "" {
		return failf(cmd, badUsage("--store is required (s3://bucket/prefix, gs://bucket/prefix, az://container[@account]/prefix, file:///dir or a path)"))
	}
	log, err := newLoggerTo(cmd.ErrOrStderr(), o.logFormat, o.logLevel)
	if err != nil {
		return failf(cmd, usageError{err})
	}
	if check != nil {
		if err := check(); err != nil {
			return failf(cmd, err)
		}
	}
	ctx := cmd.Context()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := all.Open(octx, o.uri, all.Options{S3Endpoint: o.s3Endpoint, Log: log, ReadOnly: true})
	if errors.Is(err, cloud.ErrBucketNotFound) {
		return failf(cmd, fmt.Errorf("%w (nothing was created; check --store)", err))
	}
	if err != nil {
		return failf(cmd, err)
	}
	defer st.Close()
	if empty, err := isEmpty(octx, st); err != nil {
		return failf(cmd, err)
	} else if empty {
		return failf(cmd, fmt.Errorf("%s %w", st.URI(""), errNoRun))
	}
	if cmd.Name() == "restore" { // it shows its own progress
		err = fn(ctx, st, log)
	} else {
		// What fn prints waits until the spinner is gone.
		out, buf := cmd.OutOrStdout(), &bytes.Buffer{}
		// Off a terminal the "still reading" lines are info: shown at
		// --log-level info, not at the default warn.
		stop := busy(cmd.ErrOrStderr(), "reading "+st.URI(""), log)
		cmd.SetOut(buf)
		err = fn(ctx, st, log)
		stop()
		cmd.SetOut(out)
		if _, werr := out.Write(buf.Bytes()); err == nil {
			err = werr
		}
	}
	if err != nil {
		return failf(cmd, err)
	}
	return nil
}

// isEmpty reports whether st holds no object at all.
func isEmpty(ctx context.Context, st cloud.Store) (bool, error) {
	errFound := errors.New("found")
	err := st.List(ctx, "", func(cloud.ObjectInfo) error { return errFound })
	if errors.Is(err, errFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("list %s: %w", st.URI(""), err)
	}
	return true, nil
}
