// Package gcs implements cloud.Store on Google Cloud Storage through
// cloud.google.com/go/storage (JSON API, resumable uploads).
package gcs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	gax "github.com/googleapis/gax-go/v2"
	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Each resumable writer buffers one ChunkSize so that a failed chunk can be
// resent. 16 MiB chunks keep the per-request overhead small on a fast link
// (GCS recommends ≥ 8 MiB); BufferMemory bounds the sum over concurrent
// Puts (8 writers at 16 MiB), so memory stays flat however many files a
// checkpoint has: further Puts wait for a writer to finish.
const (
	defaultChunkSize    = 16 << 20
	defaultBufferMemory = 128 << 20
	chunkQuantum        = 256 << 10 // the library rounds ChunkSize up to this
)

// Options tunes the store. The zero value uses the defaults.
type Options struct {
	ChunkSize     int   // bytes per resumable-upload request (and buffer)
	BufferMemory  int64 // bytes of writer buffers shared by all Puts
	Log           *zap.Logger
	ClientOptions []option.ClientOption // extra client options (tests, tools)
}

// Store keeps objects in one bucket under a prefix.
type Store struct {
	client *storage.Client
	bucket *storage.BucketHandle
	name   string
	prefix string // "" or ends with "/"
	opts   Options
	mem    *semaphore.Weighted
	log    *zap.Logger
}

var _ cloud.Store = (*Store)(nil)

// New opens the bucket with Application Default Credentials, or without
// authentication when STORAGE_EMULATOR_HOST is set (the library's rule).
// It makes no request; call Check to verify access.
func New(ctx context.Context, bucket, prefix string, opts Options) (*Store, error) {
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = defaultChunkSize
	}
	opts.ChunkSize = roundUp(opts.ChunkSize, chunkQuantum)
	if opts.BufferMemory <= 0 {
		opts.BufferMemory = defaultBufferMemory
	}
	opts.BufferMemory = max(opts.BufferMemory, int64(opts.ChunkSize))
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	// JSON reads: one API for every call, and the one emulators serve
	// without extra host configuration.
	copts := append([]option.ClientOption{storage.WithJSONReads()}, opts.ClientOptions...)
	client, err := storage.NewClient(ctx, copts...)
	if err != nil {
		return nil, fmt.Errorf("gcs client: %w", explainCredentials(err))
	}
	// One attempt per request: the store's operations are retried once,
	// by the wrapper all.Open stacks around it. Put is the exception
	// (putRetries).
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	prefix = cloud.KeyPrefix(prefix)
	return &Store{
		client: client, bucket: client.Bucket(bucket), name: bucket, prefix: prefix, opts: opts,
		mem: semaphore.NewWeighted(opts.BufferMemory),
		log: opts.Log.With(zap.String("store", "gs://"+bucket+"/"+prefix)),
	}, nil
}

func roundUp(n, q int) int { return (n + q - 1) / q * q }

// URI returns gs://bucket/prefix/key.
func (s *Store) URI(key string) string { return "gs://" + s.name + "/" + s.prefix + key }

// Close closes the client.
func (s *Store) Close() error { return s.client.Close() }

func (s *Store) object(key string) (*storage.ObjectHandle, error) {
	if err := cloud.ValidKey(key); err != nil {
		return nil, err
	}
	return s.bucket.Object(s.prefix + key), nil
}

// Check verifies that the bucket exists and the credentials may list it,
// by listing at most one object under the prefix.
func (s *Store) Check(ctx context.Context) error {
	it := s.bucket.Objects(ctx, &storage.Query{Prefix: s.prefix})
	it.PageInfo().MaxSize = 1
	if _, err := it.Next(); err != nil && !errors.Is(err, iterator.Done) {
		return fmt.Errorf("gs://%s: %w", s.name, translate(err))
	}
	return nil
}

// putRetries lets the library retry Put's requests (each chunk of a
// resumable upload, with its own backoff, for up to 32 s per chunk, the
// writer's default ChunkRetryDeadline, as before): the chunk is in
// the writer's buffer, so the library can resend it, while the caller's
// reader has moved on and the wrapper above could not replay it. Writes
// of checkpoint data are safe to repeat (same bytes, same key), so
// unconditional ones are retried too, not only the idempotent calls.
// Every other request makes one attempt and is retried by that wrapper,
// so no request is retried twice.
//
// A context with a bound on the waits (cloud.WithMaxWait: the run
// journal's writes at exit) caps the library's backoff by it: its 30 s
// could outlast the exit's wait for a write that the store, back a moment
// later, would take.
func putRetries(ctx context.Context, o *storage.ObjectHandle) *storage.ObjectHandle {
	opts := []storage.RetryOption{storage.WithPolicy(storage.RetryAlways)}
	if d := cloud.MaxWait(ctx); d > 0 {
		opts = append(opts, storage.WithBackoff(gax.Backoff{Initial: min(time.Second, d), Max: d, Multiplier: 2}))
	}
	return o.Retryer(opts...)
}

// Retryable reports whether an operation that failed with err is worth
// another attempt, by the library's own classification (429, 5xx,
// connection resets, unexpected EOF). all.Open's retry wrapper asks it.
func (s *Store) Retryable(err error) bool {
	for err != nil {
		if storage.ShouldRetry(err) {
			return true
		}
		// ShouldRetry follows Unwrap() error only; translate joins two.
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			return slices.ContainsFunc(u.Unwrap(), s.Retryable)
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return false
		}
	}
	return false
}

// translate maps GCS errors to the cloud sentinels.
// ErrNoCredentials: Application Default Credentials found none. The
// library gives it no type: matched on its text, in one place, with the
// library's error kept in the chain.
var ErrNoCredentials = errors.New("no Google credentials found (looked in GOOGLE_APPLICATION_CREDENTIALS, " +
	"gcloud's application default credentials in ~/.config/gcloud (gcloud auth application-default login), " +
	"and the GCE or GKE metadata server's service account (GKE: workload identity))")

// explainCredentials names a credentials failure of the client's start:
// none found, or the file GOOGLE_APPLICATION_CREDENTIALS names unusable.
func explainCredentials(err error) error {
	if strings.Contains(err.Error(), "could not find default credentials") {
		return fmt.Errorf("%w: %w", ErrNoCredentials, err)
	}
	if f := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS"); f != "" {
		return fmt.Errorf("GOOGLE_APPLICATION_CREDENTIALS=%s is no usable credentials file (a service account key or an external account's JSON): %w", f, err)
	}
	return err
}

func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, storage.ErrBucketNotExist) {
		return fmt.Errorf("%w: %w", cloud.ErrBucketNotFound, err)
	}
	if errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("%w: %w", cloud.ErrNotExist, err)
	}
	var gerr *googleapi.Error
	if errors.As(err, &gerr) {
		switch gerr.Code {
		case 412:
			return fmt.Errorf("%w: %w", cloud.ErrPrecondition, err)
		case 401, 403:
			return fmt.Errorf("%w: %w", cloud.ErrAccessDenied, err)
		case 404:
			if strings.Contains(strings.ToLower(gerr.Message), "bucket") {
				return fmt.Errorf("%w: %w", cloud.ErrBucketNotFound, err)
			}
			return fmt.Errorf("%w: %w", cloud.ErrNotExist, err)
		}
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		return fmt.Errorf("%w: %w", cloud.ErrUnreachable, err)
	}
	return err
}
