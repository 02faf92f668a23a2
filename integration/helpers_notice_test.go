package integration

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// noticeArgs are the flags of a run that watches a fake cloud: the cloud
// flags come in extra (see cloudArgs).
func noticeArgs(dir, store string, extra ...string) []string {
	args := []string{"run", "--store", store, "--run-id", "it",
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--socket", filepath.Join(dir, "a.sock"),
		"--interval", "1h", "--poll-interval", "100ms", "--log-level", "info"}
	return append(args, extra...)
}

// startFake starts the fake metadata server of cloud (aws, gcp, azure),
// closed at the end of the test.
func startFake(t *testing.T, cloudName string) fake.Server {
	t.Helper()
	s, err := fake.Start(cloudName, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// cloudArgs points spotagent at a fake (or at url, a proxy in front of it).
func cloudArgs(t *testing.T, cloudName, url string) []string {
	t.Helper()
	args := []string{"--cloud", cloudName}
	switch cloudName {
	case "aws":
		return append(args, "--aws-imds-endpoint", url)
	case "gcp":
		return append(args, "--gcp-metadata-host", strings.TrimPrefix(url, "http://"))
	case "azure":
		return append(args, "--azure-metadata-endpoint", url)
	}
	t.Fatalf("unknown cloud %q", cloudName)
	return nil
}

// s3Env is what the binary needs to use srv. s3test turns the SDK's IMDS
// credential lookups off (AWS_EC2_METADATA_DISABLED=true); the AWS notice
// source watches all the same (pkg/metadata/aws TestWatch).
func s3Env(srv *s3test.Server) []string { return srv.Env() }

// openTestStore opens uri in the test process, to read what the binary wrote.
func openTestStore(t *testing.T, uri string, opts all.Options) cloud.Store {
	t.Helper()
	st, err := all.Open(t.Context(), uri, opts)
	if err != nil {
		t.Fatalf("open store %s: %v", uri, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// noticeJournal reads journal.json from the store.
func noticeJournal(t *testing.T, st cloud.Store) *journal.Journal {
	t.Helper()
	j, err := journal.Read(t.Context(), st, "it")
	if err != nil {
		t.Fatalf("read journal: %v", err)
	}
	return j
}

// oneInterruption returns the journal's only interruption.
func oneInterruption(t *testing.T, j *journal.Journal) journal.Interruption {
	t.Helper()
	if got, want := len(j.Interruptions), 1; got != want {
		t.Fatalf("journal has %d interruptions, want %d: %+v", got, want, j.Interruptions)
	}
	return j.Interruptions[0]
}

func readLatestPointer(t *testing.T, st cloud.Store) checkpoint.Latest {
	t.Helper()
	l, err := checkpoint.ReadLatest(t.Context(), st)
	if err != nil {
		t.Fatalf("read latest: %v", err)
	}
	return l
}

// committedBeforeDeadline checks the journal says the interruption
// checkpoint committed, and before the notice's deadline.
func committedBeforeDeadline(t *testing.T, in journal.Interruption) {
	t.Helper()
	if !in.CommitOK || in.Committed == nil {
		t.Fatalf("interruption not committed: %+v", in)
	}
	if in.Deadline == nil {
		t.Fatalf("interruption has no deadline: %+v", in)
	}
	if !in.Committed.Before(*in.Deadline) {
		t.Fatalf("committed at %s, not before the deadline %s", in.Committed, in.Deadline)
	}
	if in.Requested == nil || in.Done == nil || in.Requested.After(*in.Done) || in.Done.After(*in.Committed) {
		t.Fatalf("requested %v, done %v, committed %v: want them in that order", in.Requested, in.Done, in.Committed)
	}
}

// runSpotagentTool runs a spotagent subcommand to completion and returns its output.
func runSpotagentTool(t *testing.T, env []string, args ...string) string {
	t.Helper()
	// The plain build even in a raceAgentTests test: these commands only
	// read the store, and under the race detector report's advice took
	// over a minute at load 14 (TestDistributed_RestoreFromPeerReplica).
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin, err := plainBuild.get()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("spotagent %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ackRecorder is a reverse proxy in front of the fake Azure IMDS that
// records, for every acknowledgement (POST scheduledevents), when it
// arrived and what latest.json said at that instant, before passing it on.
type ackRecorder struct {
	URL string

	mu   sync.Mutex
	acks []ackSeen
}

type ackSeen struct {
	at     time.Time
	latest checkpoint.Latest
	err    error // reading latest.json
}

func newAckRecorder(t *testing.T, target string, st cloud.Store) *ackRecorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	a := &ackRecorder{}
	rp := transparentProxy(u)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/metadata/scheduledevents" {
			s := ackSeen{at: time.Now()}
			s.latest, s.err = checkpoint.ReadLatest(context.Background(), st)
			a.mu.Lock()
			a.acks = append(a.acks, s)
			a.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	})}
	ln := loopbackListener(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	a.URL = "http://" + ln.Addr().String()
	return a
}

func (a *ackRecorder) seen() []ackSeen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ackSeen(nil), a.acks...)
}

// transparentProxy forwards to u unchanged: the same Host header (the S3 client
// signed it) and no X-Forwarded-For (the metadata fakes refuse proxied
// requests, as the real services do).
func transparentProxy(u *url.URL) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(u)
		r.Out.Host = r.In.Host
	}}
}

func loopbackListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
