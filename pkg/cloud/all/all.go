// Package all opens a cloud.Store from a URI. It is the one list of
// backends: adding one is a package and a case here.
package all

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/gcs"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// Options carries the backend settings the CLI exposes as flags. Zero
// values take each backend's defaults.
type Options struct {
	S3Endpoint    string
	S3PartSize    int64
	S3Concurrency int
	GCSChunkSize  int
	Log           *zap.Logger
	// CheckTimeout bounds the access check (default 15 s).
	CheckTimeout time.Duration
	// ReadOnly opens the store for a command that only reads it (list,
	// history, report, restore): nothing is created in it, not even the
	// file store's directory, whose absence is cloud.ErrBucketNotFound,
	// and the access check writes nothing.
	ReadOnly bool
}

type checker interface {
	cloud.Store
	Check(ctx context.Context) error
}

// readChecker is a backend whose Check writes (the file store's); with
// ReadOnly, Open calls CheckRead instead.
type readChecker interface {
	CheckRead(ctx context.Context) error
}

// Open parses uri, builds the store and checks access (the bucket exists,
// credentials work, the endpoint answers) before returning, so a bad
// --store fails with one clear error before a trainer starts. Errors wrap
// ErrUnknownScheme, ErrMalformedURI, cloud.ErrBucketNotFound,
// cloud.ErrAccessDenied or cloud.ErrUnreachable where they apply.
func Open(ctx context.Context, uri string, opts Options) (cloud.Store, error) {
	scheme, bucket, prefix, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.CheckTimeout)
	defer cancel()
	st, err := open(ctx, scheme, bucket, prefix, opts)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", uri, err)
	}
	check := st.Check
	if rc, ok := st.(readChecker); ok && opts.ReadOnly {
		check = rc.CheckRead
	}
	if err := check(ctx); err != nil {
		st.Close()
		return nil, fmt.Errorf("open store %s: %w", uri, err)
	}
	opts.Log.Info("store opened", zap.String("uri", st.URI("")))
	return st, nil
}

func open(ctx context.Context, scheme, bucket, prefix string, opts Options) (checker, error) {
	switch scheme {
	case "file":
		if opts.ReadOnly {
			return file.Open(prefix)
		}
		return file.New(prefix)
	case "s3":
		return s3.New(ctx, bucket, prefix, s3.Options{
			Endpoint: opts.S3Endpoint, PartSize: opts.S3PartSize, Concurrency: opts.S3Concurrency, Log: opts.Log,
		})
	case "gs":
		return gcs.New(ctx, bucket, prefix, gcs.Options{ChunkSize: opts.GCSChunkSize, Log: opts.Log})
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownScheme, scheme)
}
