// Package all opens a cloud.Store from a URI. It is the one list of
// backends: adding one is a package and a case here.
package all

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/azblob"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/gcs"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
	"github.com/spotagent/spotagent/pkg/cloud/wrap"
)

// Options carries the backend settings the CLI exposes as flags. Zero
// values take each backend's defaults.
type Options struct {
	S3Endpoint    string
	S3PartSize    int64
	S3Concurrency int
	GCSChunkSize  int
	// AzureBlockSize and AzureConcurrency tune az:// stores (staged block
	// size, blocks in flight per Put); its endpoint and credentials come
	// from the environment (pkg/cloud/azblob) unless AzureCredentials sets
	// one (a test's in-process client of its own emulator, whose agents
	// get the environment).
	AzureBlockSize   int64
	AzureConcurrency int
	AzureCredentials azblob.Credentials
	Log              *zap.Logger
	// CheckTimeout bounds the access check (default 15 s).
	CheckTimeout time.Duration
	// Observer, when set, sees every store operation (metrics).
	Observer wrap.Observer
	// Retry tunes the retries of the store's operations; the zero value
	// takes wrap.Retry's defaults.
	Retry wrap.RetryOptions
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
// credentials work, the endpoint answers; two attempts) before returning,
// so a bad --store fails with one clear error before a trainer starts.
// Errors name the URI and, where they apply, wrap cloud.ErrBucketNotFound,
// cloud.ErrAccessDenied or cloud.ErrUnreachable; a malformed URI or an
// unknown scheme says so in its message.
//
// The store it returns is the plain backend wrapped once, here and
// nowhere else (restic's layering): wrap.Observe (metrics) and wrap.Log
// see each attempt, wrap.Retry outermost retries what the backend judges
// retryable. The backends make one attempt of each operation, except the
// requests of Put, which their SDKs retry (see wrap.Retry).
func Open(ctx context.Context, uri string, opts Options) (cloud.Store, error) {
	scheme, bucket, prefix, err := parseURI(uri)
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
	retryable := retryableFor(st)
	// Two attempts: a down endpoint should fail in seconds, not retry
	// until the deadline.
	err = retry.Do(ctx, retry.Policy{Attempts: 2, Backoff: retry.Backoff{Min: 250 * time.Millisecond},
		Retryable: func(err error) bool { return !wrap.Permanent(err) && retryable(err) }}, check)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("open store %s: %w", uri, err)
	}
	opts.Log.Info("store opened", zap.String("uri", st.URI("")))
	return stack(st, retryable, opts), nil
}

// stack wraps a plain backend in the layers every store gets.
func stack(st cloud.Store, retryable func(error) bool, opts Options) cloud.Store {
	if opts.Observer != nil {
		st = wrap.Observe(st, opts.Observer)
	}
	st = wrap.Log(st, opts.Log)
	ro := opts.Retry
	ro.Retryable, ro.Log = retryable, opts.Log
	return wrap.Retry(st, ro)
}

// retryableFor is the backend's judgement of which errors another attempt
// may cure (its SDK's classification; an unreachable endpoint always), or
// every error for a backend without one (file).
func retryableFor(st cloud.Store) func(error) bool {
	r, ok := st.(interface{ Retryable(error) bool })
	if !ok {
		return func(error) bool { return true }
	}
	return func(err error) bool { return errors.Is(err, cloud.ErrUnreachable) || r.Retryable(err) }
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
	case "az":
		container, account, _ := strings.Cut(bucket, "@")
		return azblob.New(ctx, account, container, prefix, azblob.Options{
			BlockSize: opts.AzureBlockSize, Concurrency: opts.AzureConcurrency, Log: opts.Log,
			Credentials: opts.AzureCredentials,
		})
	}
	return nil, fmt.Errorf("%w: %q", errUnknownScheme, scheme)
}
