// Package s3 implements cloud.Store on Amazon S3 and S3-compatible servers
// through aws-sdk-go-v2.
package s3

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Defaults, chosen for multi-GB checkpoints on a machine that must keep the
// agent under ~200 MB RSS while it uploads (4 × 256 MiB files at once):
//   - 16 MiB parts: per-request overhead (signing, TLS record, round trip)
//     is < 1 % at that size, a retried part costs little, and 10,000 parts
//     still reach 156 GiB before the part size has to grow.
//   - 8 parts in flight per object: enough to fill a 10 Gbit/s NIC at
//     typical S3 latencies (~8 × 16 MiB at 20–50 ms per part).
//   - 128 MiB of part buffers shared by every Put of the process (of every
//     store with the same part size and budget), not per upload or per
//     store: the caller's reader is a plain io.Reader (it hashes as it
//     streams), so each part must be copied into memory before it is sent.
//     A shared budget keeps memory flat however many files, or runs of a
//     node agent, upload at once; they share the 8 buffers instead of
//     multiplying them.
const (
	defaultPartSize     = 16 << 20
	defaultConcurrency  = 8
	defaultBufferMemory = 128 << 20
	minPartSize         = 5 << 20 // S3's minimum for every part but the last
	maxParts            = 10000   // S3's maximum parts per upload
	defaultMaxAttempts  = 10      // SDK default is 3; spot networks and stores flap
)

// Options tunes the store. The zero value uses the defaults above.
type Options struct {
	// Endpoint overrides the S3 endpoint (else AWS_ENDPOINT_URL_S3 or
	// AWS_ENDPOINT_URL, which the SDK reads). Any override turns on
	// path-style addressing.
	Endpoint string
	// Region, when empty, comes from the SDK config, else from the bucket
	// (or us-east-1 for an overridden endpoint).
	Region       string
	PartSize     int64 // bytes per multipart part (min 5 MiB)
	Concurrency  int   // parts in flight per Put
	BufferMemory int64 // bytes of part buffers shared by all Puts of stores with this PartSize and BufferMemory
	Log          *zap.Logger
}

// Store keeps objects in one bucket under a key prefix.
type Store struct {
	client *s3.Client
	bucket string
	prefix string // "" or ends with "/"
	opts   Options
	pool   *bufPool
	log    *zap.Logger
	// putRetryer retries each of Put's requests (see withPutRetries).
	putRetryer aws.Retryer
}

var (
	_ cloud.Store   = (*Store)(nil)
	_ cloud.Cleaner = (*Store)(nil)
)

// New builds a store from the SDK's default configuration chain: env,
// shared config and profiles, web identity (IRSA), EC2 instance role.
// It makes no request unless the region must be discovered from the
// bucket; call Check to verify access.
func New(ctx context.Context, bucket, prefix string, opts Options) (*Store, error) {
	opts = withDefaults(opts)
	var loadOpts []func(*config.LoadOptions) error
	if opts.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(opts.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3 config: %w", err)
	}
	putAttempts := defaultMaxAttempts
	if cfg.RetryMaxAttempts != 0 {
		putAttempts = cfg.RetryMaxAttempts // AWS_MAX_ATTEMPTS
	}
	overridden := false
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		overridden = o.BaseEndpoint != nil
		o.UsePathStyle = o.UsePathStyle || overridden
		// One attempt per request: the store's operations are retried
		// once, by the wrapper all.Open stacks around it. Put's requests
		// are the exception (withPutRetries).
		o.Retryer = newRetryer(1)
		o.RetryMaxAttempts = 0
		// Parts carry a CRC32C checksum that the server verifies, so a
		// second SHA-256 pass over every byte for SigV4 buys nothing.
		// Over plain HTTP (MinIO, on-premises) the checksum step would
		// still hash every part with SHA-256 unless the payload hash is
		// decided before it runs: unsignedEarly does that.
		o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware, unsignedEarly)
		// Objects are verified by the caller's CRC32C; validating response
		// checksums would also fail on servers that send the whole-object
		// checksum with a ranged GET (gofakes3).
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		o.DisableLogOutputChecksumValidationSkipped = true
		if o.Region == "" && overridden {
			o.Region = "us-east-1"
		}
	})
	if client.Options().Region == "" {
		region, err := manager.GetBucketRegion(ctx, client, bucket, func(o *s3.Options) { o.RetryMaxAttempts = 2 })
		if err != nil {
			return nil, fmt.Errorf("s3 bucket %s region: %w", bucket, translate(err))
		}
		client = s3.New(client.Options(), func(o *s3.Options) { o.Region = region })
	}
	prefix = cloud.KeyPrefix(prefix)
	return &Store{
		client: client, bucket: bucket, prefix: prefix, opts: opts, putRetryer: newRetryer(putAttempts),
		pool: sharedPool(opts.BufferMemory, opts.PartSize), log: opts.Log.With(zap.String("store", "s3://"+bucket+"/"+prefix)),
	}, nil
}

func withDefaults(o Options) Options {
	if o.PartSize <= 0 {
		o.PartSize = defaultPartSize
	}
	o.PartSize = max(o.PartSize, minPartSize)
	if o.Concurrency <= 0 {
		o.Concurrency = defaultConcurrency
	}
	if o.BufferMemory <= 0 {
		o.BufferMemory = defaultBufferMemory
	}
	// At least two parts in memory, or uploads would run one part at a time.
	o.BufferMemory = max(o.BufferMemory, 2*o.PartSize)
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// Client is the underlying SDK client, for tests and tools.
func (s *Store) Client() *s3.Client { return s.client }

// URI returns s3://bucket/prefix/key.
func (s *Store) URI(key string) string {
	return "s3://" + s.bucket + "/" + s.prefix + key
}

// Close releases nothing: the SDK client has no resources to free.
func (s *Store) Close() error { return nil }

func (s *Store) key(key string) (*string, error) {
	if err := cloud.ValidKey(key); err != nil {
		return nil, err
	}
	return aws.String(s.prefix + key), nil
}

// Check verifies that the bucket exists and the credentials may list it,
// with one ListObjectsV2 of at most one key.
func (s *Store) Check(ctx context.Context) error {
	_, err := s.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
		Bucket: &s.bucket, Prefix: aws.String(s.prefix), MaxKeys: aws.Int32(1),
	})
	if err != nil {
		return fmt.Errorf("s3://%s: %w", s.bucket, translate(err))
	}
	return nil
}

// newRetryer is the SDK's standard retryer (its classification of
// errors, exponential backoff with jitter up to 20 s) making at most
// attempts attempts per request, without a rate limiter: the SDK's retry
// quota (500 tokens, 5 a retry) is spent by one outage with 32 parts in
// flight, and then nothing is retried until 100 requests succeed. The
// caller's context (the notice deadline) bounds the retries.
func newRetryer(attempts int) aws.Retryer {
	return retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = attempts
		so.MaxBackoff = 20 * time.Second
		so.RateLimiter = ratelimit.None
	})
}

// withPutRetries lets the SDK retry one of Put's requests (PutObject, the
// parts of a multipart upload, its create, complete and abort) up to
// defaultMaxAttempts times (AWS_MAX_ATTEMPTS when set). These are the
// only retries of Put: the bytes of a part are in the store's buffer, so
// the SDK can resend them, while the caller's reader has moved on and the
// wrapper above could not replay it. Every other request makes one
// attempt and is retried by that wrapper, so no request is retried twice.
//
// A context with a bound on the waits (cloud.WithMaxWait: the run
// journal's writes at exit) caps the SDK's backoff by it: its 20 s could
// outlast the exit's wait for a write that the store, back a moment
// later, would take.
func (s *Store) withPutRetries(ctx context.Context) func(*s3.Options) {
	r := s.putRetryer
	if d := cloud.MaxWait(ctx); d > 0 {
		r = retry.AddWithMaxBackoffDelay(r, d)
	}
	return func(o *s3.Options) { o.Retryer = r }
}

// Retryable reports whether an operation that failed with err is worth
// another attempt, by the SDK's standard classification (throttling, 5xx,
// connection errors, timeouts). all.Open's retry wrapper asks it.
func (s *Store) Retryable(err error) bool {
	return s.putRetryer.IsErrorRetryable(err)
}

// unsignedEarly marks every request's payload UNSIGNED-PAYLOAD in the build
// step, before the SDK's checksum step (finalize), which otherwise computes
// a SHA-256 of each part beside its CRC32C on non-TLS connections: 35 % of
// the agent's CPU in an upload to MinIO. Integrity rests on the CRC32C the
// server verifies and the manifest's CRC32C, checked on restore.
func unsignedEarly(stack *middleware.Stack) error {
	return stack.Build.Add(middleware.BuildMiddlewareFunc("spotagentUnsignedPayloadEarly",
		func(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
			return next.HandleBuild(v4.SetPayloadHash(ctx, "UNSIGNED-PAYLOAD"), in)
		}), middleware.After)
}
