// Package s3test runs an in-process S3 server (gofakes3, in memory) on
// 127.0.0.1 for tests, and for integration tests that point a separate
// spotagent process at it through the environment (Server.Env).
package s3test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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
	verified atomic.Int64
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
		if r.Method == http.MethodPut && !s.checkCRC32C(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	s.Endpoint = s.http.URL
	return s, nil
}

// PartUploads counts the UploadPart requests the server received.
func (s *Server) PartUploads() int64 { return s.parts.Load() }

// Verified counts the PUTs whose x-amz-checksum-crc32c header the server
// checked against the body and found equal.
func (s *Server) Verified() int64 { return s.verified.Load() }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkCRC32C does what S3 does and gofakes3 does not: a PUT whose
// x-amz-checksum-crc32c header does not match its body fails with 400
// BadDigest. Bodies in aws-chunked encoding (trailing checksums, streaming
// SigV4) are passed through.
func (s *Server) checkCRC32C(w http.ResponseWriter, r *http.Request) bool {
	want := r.Header.Get("X-Amz-Checksum-Crc32c")
	if want == "" || strings.HasPrefix(r.Header.Get("X-Amz-Content-Sha256"), "STREAMING-") ||
		slices.ContainsFunc(r.Header.Values("Content-Encoding"), func(v string) bool { return strings.Contains(v, "aws-chunked") }) {
		return true
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	got := base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, crc32.Checksum(body, castagnoli)))
	if got != want {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>BadDigest</Code>"+
			"<Message>The CRC32C you specified did not match the calculated checksum.</Message></Error>")
		return false
	}
	s.verified.Add(1)
	return true
}

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
