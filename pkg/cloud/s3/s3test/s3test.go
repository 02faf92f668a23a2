// Package s3test runs an in-process S3 server (gofakes3, in memory) on
// 127.0.0.1 for tests, and for integration tests that point a separate
// spotagent process at it through the environment (Server.Env).
package s3test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Static credentials the fake server accepts (it does not check them).
const (
	AccessKey = "spotagent-test"
	SecretKey = "spotagent-test-secret"
	Region    = "us-east-1"
)

// Server is a running fake S3 server.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	Bucket   string // created at start
	backend  *s3mem.Backend
	http     *httptest.Server
	parts    atomic.Int64
}

// Start serves a fake S3 on 127.0.0.1 with bucket already created. The
// caller closes it.
func Start(bucket string) (*Server, error) {
	be := s3mem.New()
	if err := be.CreateBucket(bucket); err != nil {
		return nil, fmt.Errorf("create bucket: %w", err)
	}
	faker := gofakes3.New(be, gofakes3.WithLogger(gofakes3.DiscardLog()))
	s := &Server{Bucket: bucket, backend: be}
	h := faker.Server()
	s.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Has("partNumber") {
			s.parts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	s.Endpoint = s.http.URL
	return s, nil
}

// PartUploads counts the UploadPart requests the server received.
func (s *Server) PartUploads() int64 { return s.parts.Load() }

// CreateBucket adds another bucket.
func (s *Server) CreateBucket(name string) error { return s.backend.CreateBucket(name) }

// Env is what a spotagent process needs to use this server with
// --store s3://<Bucket>/<prefix>.
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_S3=" + s.Endpoint,
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Close stops the server.
func (s *Server) Close() { s.http.Close() }

// NewServer starts a server for the test, sets the AWS environment of the
// test process (t.Setenv: not for parallel tests) to use it, and stops it
// at the end of the test.
func NewServer(t testing.TB) (endpoint, bucket string) {
	t.Helper()
	s := New(t)
	return s.Endpoint, s.Bucket
}

// New is NewServer returning the Server.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return s
}
