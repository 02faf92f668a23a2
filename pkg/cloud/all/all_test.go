package all_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

func TestOpenFile(t *testing.T) {
	dir := t.TempDir()
	for _, uri := range []string{"file://" + dir + "/a", dir + "/b"} {
		st, err := all.Open(t.Context(), uri, all.Options{})
		if err != nil {
			t.Fatalf("open %q: %v", uri, err)
		}
		if err := st.Put(t.Context(), "k", strings.NewReader("v"), 1, cloud.PutOptions{}); err != nil {
			t.Fatalf("put via %q: %v", uri, err)
		}
		if !strings.HasPrefix(st.URI("k"), "file://"+dir) {
			t.Fatalf("URI=%q", st.URI("k"))
		}
	}
	t.Chdir(dir)
	if _, err := all.Open(t.Context(), "rel/ck", all.Options{}); err != nil {
		t.Fatalf("open relative path: %v", err)
	}
	if _, err := all.Open(t.Context(), "/proc/no/such/dir", all.Options{}); err == nil {
		t.Fatal("open of an unwritable path succeeded")
	}
}

// TestOpenFile_ReadOnly: opened read-only, a missing directory is
// ErrBucketNotFound naming it, and nothing is created, neither the
// directory nor a file in an existing one.
func TestOpenFile_ReadOnly(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent", "bucket")
	_, err := all.Open(t.Context(), "file://"+missing, all.Options{ReadOnly: true})
	wantErr(t, "missing directory", err, cloud.ErrBucketNotFound)
	if !strings.Contains(err.Error(), missing) {
		t.Fatalf("error %q does not name %s", err, missing)
	}
	if _, err := os.Stat(filepath.Join(dir, "nonexistent")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a read-only open created something: %v", err)
	}
	notDir := filepath.Join(dir, "f")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = all.Open(t.Context(), notDir, all.Options{ReadOnly: true})
	wantErr(t, "a file", err, cloud.ErrBucketNotFound)

	existing := filepath.Join(dir, "store")
	if err := os.Mkdir(existing, 0o500); err != nil { // not writable: the check must not write
		t.Fatal(err)
	}
	st, err := all.Open(t.Context(), existing, all.Options{ReadOnly: true})
	if os.Geteuid() != 0 && err != nil {
		t.Fatalf("read-only open of a read-only directory: %v", err)
	}
	if err == nil {
		st.Close()
	}
	if ents, _ := os.ReadDir(existing); len(ents) != 0 {
		t.Fatalf("a read-only open wrote %v", ents)
	}
}

func TestOpenS3(t *testing.T) {
	srv := s3test.New(t)
	st, err := all.Open(t.Context(), "s3://"+srv.Bucket+"/runs/x", all.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if got, want := st.URI("k"), "s3://"+srv.Bucket+"/runs/x/k"; got != want {
		t.Fatalf("URI=%q, want %q", got, want)
	}
	_, err = all.Open(t.Context(), "s3://no-such-bucket/x", all.Options{})
	wantErr(t, "missing bucket", err, cloud.ErrBucketNotFound)

	denied := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`<?xml version="1.0"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist.</Message></Error>`))
	}))
	defer denied.Close()
	_, err = all.Open(t.Context(), "s3://bucket/x", all.Options{S3Endpoint: denied.URL})
	wantErr(t, "denied credentials", err, cloud.ErrAccessDenied)

	_, err = all.Open(t.Context(), "s3://bucket/x", all.Options{S3Endpoint: "http://" + closedAddr(t)})
	wantErr(t, "unreachable endpoint", err, cloud.ErrUnreachable)
}

func TestOpenGCS(t *testing.T) {
	_, bucket := gcstest.NewServer(t)
	st, err := all.Open(t.Context(), "gs://"+bucket+"/runs/x", all.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer st.Close()
	_, err = all.Open(t.Context(), "gs://no-such-bucket/x", all.Options{})
	wantErr(t, "missing bucket", err, cloud.ErrBucketNotFound)

	denied := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":403,"message":"caller does not have storage.objects.list access"}}`))
	}))
	defer denied.Close()
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(denied.URL, "http://"))
	_, err = all.Open(t.Context(), "gs://bucket/x", all.Options{})
	wantErr(t, "denied credentials", err, cloud.ErrAccessDenied)

	t.Setenv("STORAGE_EMULATOR_HOST", closedAddr(t))
	_, err = all.Open(t.Context(), "gs://bucket/x", all.Options{})
	wantErr(t, "unreachable endpoint", err, cloud.ErrUnreachable)
}

// wantErr checks the sentinel and that the message is one line.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err=%v, want %v", what, err, want)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("%s: error spans lines: %q", what, err)
	}
	t.Logf("%s: %v", what, err)
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
