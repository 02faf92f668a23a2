// Package gcstest runs an in-process GCS server (fake-gcs-server, in
// memory) on 127.0.0.1 for tests, and for integration tests that point a
// separate spotagent process at it through the environment (Server.Env).
package gcstest

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// Server is a running fake GCS server.
type Server struct {
	Host   string // 127.0.0.1:port, the STORAGE_EMULATOR_HOST value
	Bucket string // created at start
	fake   *fakestorage.Server
}

// Start serves a fake GCS over plain HTTP on 127.0.0.1 with bucket
// created. The caller closes it.
func Start(bucket string) (*Server, error) {
	fake, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", NoListener: false,
	})
	if err != nil {
		return nil, fmt.Errorf("fake gcs: %w", err)
	}
	u, err := url.Parse(fake.URL())
	if err != nil {
		fake.Stop()
		return nil, fmt.Errorf("fake gcs url: %w", err)
	}
	fake.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	return &Server{Host: u.Host, Bucket: bucket, fake: fake}, nil
}

// Env is what a spotagent process needs to use this server with
// --store gs://<Bucket>/<prefix>.
func (s *Server) Env() []string { return []string{"STORAGE_EMULATOR_HOST=" + s.Host} }

// Close stops the server.
func (s *Server) Close() { s.fake.Stop() }

// NewServer starts a server for the test, sets STORAGE_EMULATOR_HOST for
// the test process (t.Setenv: not for parallel tests), and stops the
// server at the end of the test.
func NewServer(t testing.TB) (host, bucket string) {
	t.Helper()
	s, err := Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Setenv("STORAGE_EMULATOR_HOST", s.Host)
	return s.Host, s.Bucket
}
