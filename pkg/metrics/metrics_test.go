package metrics

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// scrape fetches /metrics over HTTP and parses the text format.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the metric in fams with exactly these labels
// (a histogram gives its sample count), and whether it exists.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if want[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetrics_Moves(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	at := time.Unix(1_777_000_000, 500_000_000)
	tests := []struct {
		name   string
		call   func()
		metric string
		labels []string
		want   float64
	}{
		{"Notice", func() { m.Notice("aws", "termination"); m.Notice("aws", "termination") },
			"spotagent_notices_total", []string{"cloud", "aws", "kind", "termination"}, 2},
		{"NoticeToRequest", func() { m.NoticeToRequest(3 * time.Millisecond) },
			"spotagent_notice_to_request_seconds", nil, 1},
		{"PhaseSave", func() { m.Phase("save", 2*time.Second) },
			"spotagent_checkpoint_phase_seconds", []string{"phase", "save"}, 1},
		{"PhaseUpload", func() { m.Phase("upload", time.Second); m.Phase("upload", time.Second) },
			"spotagent_checkpoint_phase_seconds", []string{"phase", "upload"}, 2},
		{"UploadedBytes", func() { m.Uploaded(1000, 2*time.Second); m.Uploaded(3000, 500*time.Millisecond) },
			"spotagent_uploaded_bytes_total", nil, 4000},
		{"Throughput", nil, // the last upload: 3000 B in 0.5 s
			"spotagent_upload_throughput_bytes_per_second", nil, 6000},
		{"CommittedStep", func() { m.Committed(1200, at) },
			"spotagent_last_committed_step", nil, 1200},
		{"CommittedTime", nil,
			"spotagent_last_committed_timestamp_seconds", nil, 1_777_000_000.5},
		{"Interval", func() { m.Interval(15 * time.Minute) },
			"spotagent_checkpoint_interval_seconds", nil, 900},
		{"CommitFailed", func() { m.CommitFailed("deadline") },
			"spotagent_commit_failures_total", []string{"reason", "deadline"}, 1},
		{"Error", func() { m.Error("journal"); m.Error("journal"); m.Error("restore") },
			"spotagent_errors_total", []string{"component", "journal"}, 2},
		{"RestoreSeconds", func() { m.Restored(1<<20, 1500*time.Millisecond) },
			"spotagent_restore_seconds", nil, 1.5},
		{"RestoreBytes", nil,
			"spotagent_restore_bytes", nil, 1 << 20},
		{"RestoreFromLocal", func() { m.RestoredFrom(map[string]int64{"local": 3000, "store": 500}) },
			"spotagent_restore_source_bytes", []string{"source", "local"}, 3000},
		{"RestoreFromStore", nil,
			"spotagent_restore_source_bytes", []string{"source", "store"}, 500},
		{"Ready", func() { m.Ready(true) },
			"spotagent_ready", nil, 1},
		{"Machine", func() { m.Machine("aws", "p4d.24xlarge", "us-east-1a") },
			"spotagent_instance_info", []string{"cloud", "aws", "instance_type", "p4d.24xlarge", "zone", "us-east-1a"}, 1},
		{"NoticeCommitted", func() { m.NoticeCheckpoint(true, 40*time.Second, 2*time.Minute) },
			"spotagent_notice_checkpoints_total", []string{"result", "committed"}, 1},
		{"NoticeToCommitted", nil, "spotagent_notice_to_committed_seconds", nil, 1},
		{"NoticeFailed", func() { m.NoticeCheckpoint(false, 30*time.Second, 30*time.Second) },
			"spotagent_notice_checkpoints_total", []string{"result", "failed"}, 1},
		{"NoticeLead", nil, "spotagent_notice_lead_seconds", nil, 2},
		{"NoticePredicted", func() {
			m.NoticePromise(40*time.Second, map[string]time.Duration{"aws": 115 * time.Second, "gcp": 25 * time.Second})
		}, "spotagent_notice_checkpoint_predicted_seconds", nil, 40},
		{"NoticeBudget", nil, "spotagent_notice_budget_seconds", []string{"cloud", "gcp"}, 25},
		{"NoticeFitsAWS", nil, "spotagent_notice_checkpoint_fits", []string{"cloud", "aws"}, 1},
		{"NoticeFitsGCP", nil, "spotagent_notice_checkpoint_fits", []string{"cloud", "gcp"}, 0},
		{"NoticeFitsAgain", func() {
			m.NoticePromise(20*time.Second, map[string]time.Duration{"aws": 115 * time.Second, "gcp": 25 * time.Second})
		}, "spotagent_notice_checkpoint_fits", []string{"cloud", "gcp"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.call != nil {
				before, _ := value(scrape(t, srv.URL), tt.metric, tt.labels...)
				if before == tt.want {
					t.Fatalf("%s=%v before the call already", tt.metric, before)
				}
				tt.call()
			}
			got, ok := value(scrape(t, srv.URL), tt.metric, tt.labels...)
			if !ok {
				t.Fatalf("%s%v missing", tt.metric, tt.labels)
			}
			if math.Abs(got-tt.want) > 1e-6 {
				t.Fatalf("%s%v=%v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}
}

func TestMetrics_Families(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams := scrape(t, srv.URL)
	// Present before any event: a dashboard shows zeros, not "no data".
	for _, name := range []string{
		"spotagent_notice_to_request_seconds", "spotagent_checkpoint_phase_seconds",
		"spotagent_uploaded_bytes_total", "spotagent_last_committed_step", "spotagent_ready",
		"go_goroutines", "process_start_time_seconds",
	} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}
	if got, ok := value(fams, "spotagent_notice_checkpoints_total", "result", "failed"); !ok || got != 0 {
		t.Errorf("failed notice checkpoints=%v (present %v), want 0: the alert on them needs the series", got, ok)
	}
	if got, ok := value(fams, "spotagent_checkpoint_phase_seconds", "phase", "commit"); !ok || got != 0 {
		t.Errorf("commit phase=%v (present %v), want 0", got, ok)
	}
	h := fams["spotagent_notice_to_request_seconds"].GetMetric()[0].GetHistogram()
	if got := h.GetBucket()[0].GetUpperBound(); got != 0.001 {
		t.Errorf("first notice bucket=%v, want 0.001", got)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetrics_Health(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	steps := []struct {
		name    string
		ready   *bool
		healthz int
		readyz  int
	}{
		{"Start", nil, 200, 503},
		{"Ready", ptr(true), 200, 200},
		{"Stopping", ptr(false), 200, 503},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.ready != nil {
				m.Ready(*s.ready)
			}
			if got, _ := get(t, srv.URL+"/healthz"); got != s.healthz {
				t.Errorf("/healthz=%d, want %d", got, s.healthz)
			}
			if got, _ := get(t, srv.URL+"/readyz"); got != s.readyz {
				t.Errorf("/readyz=%d, want %d", got, s.readyz)
			}
		})
	}
	if got, _ := get(t, srv.URL+"/nope"); got != http.StatusNotFound {
		t.Errorf("/nope=%d, want 404", got)
	}
}

func ptr[T any](v T) *T { return &v }

func TestServe(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		// Find a free port, then hand it to Serve.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		m := New()
		stop, err := Serve(context.Background(), addr, m, nil)
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
		m.Ready(true)
		if got, body := get(t, "http://"+addr+"/readyz"); got != 200 || body != "ok\n" {
			t.Fatalf("/readyz=%d %q, want 200 ok", got, body)
		}
		if got, body := get(t, "http://"+addr+"/metrics"); got != 200 || !strings.Contains(body, "spotagent_ready 1") {
			t.Fatalf("/metrics=%d, ready gauge missing:\n%s", got, body)
		}
		stop()
		stop() // idempotent
		if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
			t.Fatal("server still answers after stop")
		}
	})
	t.Run("ErrBusy", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		stop, err := Serve(context.Background(), ln.Addr().String(), New(), nil)
		if err == nil {
			stop()
			t.Fatal("Serve on a busy address succeeded")
		}
	})
	t.Run("ErrBadAddr", func(t *testing.T) {
		stop, err := Serve(context.Background(), "not-an-address", New(), nil)
		if err == nil {
			stop()
			t.Fatal("Serve on a bad address succeeded")
		}
	})
	t.Run("ContextEnds", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		stop, err := Serve(ctx, addr, New(), nil)
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
		cancel()
		stop() // returns once shut down
		if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
			t.Fatal("server still answers after its context ended")
		}
	})
}

func TestMetrics_Goodput(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	if got, ok := value(scrape(t, srv.URL), "spotagent_goodput_seconds", "bucket", "lost"); !ok || got != 0 {
		t.Fatalf("lost before any accounting=%v (present %v), want 0", got, ok)
	}
	m.Goodput(&journal.Goodput{Ratio: 0.9, Seconds: map[string]float64{"productive": 900, "lost": 100}})
	fams := scrape(t, srv.URL)
	if got, _ := value(fams, "spotagent_goodput_ratio"); got != 0.9 {
		t.Errorf("ratio=%v, want 0.9", got)
	}
	if got, _ := value(fams, "spotagent_goodput_seconds", "bucket", "lost"); got != 100 {
		t.Errorf("lost=%v, want 100", got)
	}
}

// A new machine replaces the info series: one agent, one machine.
func TestMetrics_MachineReplaces(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	m.Machine("aws", "p5.48xlarge", "us-east-1a")
	m.Machine("gcp", "a3-highgpu-8g", "us-central1-a")
	if got := len(scrape(t, srv.URL)["spotagent_instance_info"].GetMetric()); got != 1 {
		t.Fatalf("%d instance_info series, want 1", got)
	}
	if _, ok := value(scrape(t, srv.URL), "spotagent_instance_info", "cloud", "gcp", "instance_type", "a3-highgpu-8g", "zone", "us-central1-a"); !ok {
		t.Fatal("the second machine's series is missing")
	}
}
