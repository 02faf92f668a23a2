// Package azblob implements cloud.Store on Azure Blob Storage (block
// blobs) through the Azure SDK's azblob client.
package azblob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Defaults, as the S3 store's and for the same reasons (see pkg/cloud/s3):
// 16 MiB blocks, 8 in flight per object, 128 MiB of block buffers shared by
// every Put of the process. Azure allows 50,000 committed blocks a blob, so
// 16 MiB blocks reach 781 GiB before the block size has to grow.
const (
	defaultBlockSize    = 16 << 20
	defaultConcurrency  = 8
	defaultBufferMemory = 128 << 20
	minBlockSize        = 1 << 20
	maxBlocks           = 50000
	defaultMaxAttempts  = 10 // Put's requests; spot networks and stores flap
)

// Options tunes the store. The zero value uses the defaults above and the
// credentials of the environment (Credentials.FromEnv).
type Options struct {
	// Endpoint overrides the blob service URL (else AZURE_STORAGE_ENDPOINT,
	// or the connection string's BlobEndpoint): an emulator's, with the
	// account in its path (http://127.0.0.1:10000/devstoreaccount1).
	Endpoint     string
	Credentials  Credentials
	BlockSize    int64 // bytes per staged block
	Concurrency  int   // blocks in flight per Put
	BufferMemory int64 // bytes of block buffers shared by every Put with this BlockSize and BufferMemory
	Log          *zap.Logger
	// HTTPClient replaces the store's own HTTP client (tests, tools).
	HTTPClient *http.Client
}

// Store keeps block blobs in one container under a name prefix.
type Store struct {
	client    *container.Client
	account   string
	container string
	prefix    string // "" or ends with "/"
	cred      string // the credential used, for errors
	opts      Options
	pool      *bufPool
	log       *zap.Logger
}

var _ cloud.Store = (*Store)(nil)

// New opens container in account, with the credential Options.Credentials
// picks (see Credentials). account may be empty when the environment or a
// connection string names it. It makes no request; call Check to verify
// access. A test sets a key or connection string, so the default chain,
// which would ask the VM's metadata endpoint for a managed identity, is
// never built.
func New(ctx context.Context, account, containerName, prefix string, opts Options) (*Store, error) {
	opts = withDefaults(opts)
	if opts.Endpoint == "" {
		opts.Endpoint = firstEnv(envEndpoint)
	}
	if account == "" {
		account = firstEnv(envAccount, envAccountName)
	}
	if opts.Credentials.ConnectionString != "" {
		cs, err := parseConnString(opts.Credentials.ConnectionString)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envConnString, err)
		}
		account = cmp.Or(account, cs.account)
	}
	if account == "" {
		return nil, fmt.Errorf("no storage account: name it in the URI (az://%s@ACCOUNT/...) or set %s", containerName, envAccount)
	}
	copts := &container.ClientOptions{}
	copts.Transport = opts.HTTPClient
	// One attempt per request: the store's operations are retried by the
	// wrapper all.Open stacks around it. Put's requests are the exception
	// (attempts).
	copts.Retry = policy.RetryOptions{MaxRetries: -1}
	client, cred, err := clientFor(account, containerName, opts.Endpoint, opts.Credentials, copts)
	if err != nil {
		return nil, fmt.Errorf("azure blob client: %w", err)
	}
	prefix = cloud.KeyPrefix(prefix)
	s := &Store{client: client, account: account, container: containerName, prefix: prefix, cred: cred, opts: opts,
		pool: sharedPool(opts.BufferMemory, opts.BlockSize)}
	s.log = opts.Log.With(zap.String("store", s.URI("")), zap.String("credential", cred))
	return s, nil
}

func withDefaults(o Options) Options {
	if o.BlockSize <= 0 {
		o.BlockSize = defaultBlockSize
	}
	o.BlockSize = max(o.BlockSize, minBlockSize)
	if o.Concurrency <= 0 {
		o.Concurrency = defaultConcurrency
	}
	if o.BufferMemory <= 0 {
		o.BufferMemory = defaultBufferMemory
	}
	o.BufferMemory = max(o.BufferMemory, 2*o.BlockSize)
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	o.Credentials = o.Credentials.FromEnv()
	if o.HTTPClient == nil {
		o.HTTPClient = newHTTPClient(o.Concurrency)
	}
	return o
}

// newHTTPClient keeps a connection per block in flight (and some for
// concurrent Puts) alive between requests: Go's default of 2 idle
// connections a host would close and reopen most of them for each block.
func newHTTPClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 4 * concurrency
	t.MaxIdleConns = 0
	t.WriteBufferSize = 256 << 10
	t.ReadBufferSize = 256 << 10
	return &http.Client{Transport: t}
}

// URI returns az://container@account/prefix/key.
func (s *Store) URI(key string) string {
	return "az://" + s.container + "@" + s.account + "/" + s.prefix + key
}

// Close releases idle connections.
func (s *Store) Close() error {
	s.opts.HTTPClient.CloseIdleConnections()
	return nil
}

// Client is the SDK's container client, for tests and tools.
func (s *Store) Client() *container.Client { return s.client }

func (s *Store) name(key string) (string, error) {
	if err := cloud.ValidKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// Check verifies that the container exists and the credential may list
// it, with one listing of at most one blob.
func (s *Store) Check(ctx context.Context) error {
	pager := s.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &s.prefix, MaxResults: to.Ptr(int32(1))})
	if _, err := pager.NextPage(ctx); err != nil {
		return fmt.Errorf("%s (credential: %s): %w", s.URI(""), s.cred, s.translate(err))
	}
	return nil
}

// attempts runs one of Put's requests (Put Blob, a staged block, the
// commit) up to defaultMaxAttempts times while it fails retryably: the
// block's bytes are in the store's buffer, so it can be sent again, while
// the caller's reader has moved on and the wrapper above could not replay
// it. Every other request makes one attempt and is retried by that
// wrapper, so no request is retried twice. A commit retried after a lost
// answer meets its own write: see put.go.
//
// Each attempt is a new request with a new body (send makes it): not the
// SDK's retry policy, which rewinds the one body by Seek while net/http
// may still be reading it for the attempt before (a transport may read a
// request's body after RoundTrip returned, golang/go#51907; the race
// detector caught it in TestServiceUnavailableStorm). For the same reason
// failed reports whether any attempt failed: the caller must not reuse the
// bytes behind the bodies then.
func (s *Store) attempts(ctx context.Context, send func(ctx context.Context) error) (failed bool, err error) {
	n := 0
	bo := retry.Backoff{Min: 200 * time.Millisecond, Max: 20 * time.Second}
	if d := cloud.MaxWait(ctx); d > 0 { // the run journal's writes at exit
		bo = bo.Capped(d)
	}
	err = retry.Do(ctx, retry.Policy{Attempts: defaultMaxAttempts, Backoff: bo,
		Retryable: sendRetryable(s.Retryable)}, func(ctx context.Context) error {
		n++
		return send(ctx)
	})
	return n > 1 || err != nil, err
}

// sendRetryable is the classification attempts retries by, as the SDK's
// retry policy did: a response by its status (retryable), any other error
// of the transport (a reset, a cut body, a closed connection) but the
// context's.
func sendRetryable(retryable func(error) bool) func(error) bool {
	return func(err error) bool {
		var re *azcore.ResponseError
		if errors.As(err, &re) {
			return retryable(err)
		}
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
}

// Retryable reports whether an operation that failed with err is worth
// another attempt, by the SDK's own classification: 408, 429, 500, 502,
// 503, 504, and transport errors (a reset connection, a body cut short).
// all.Open's retry wrapper asks it.
func (s *Store) Retryable(err error) bool {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		switch re.StatusCode {
		case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
			http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, cloud.ErrUnreachable) || errors.Is(err, errTransport)
}
