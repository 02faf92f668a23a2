package fake_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

func do(t *testing.T, method, url string, hdr map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestAWS_IMDSv2Enforced(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	if code, _, _ := do(t, "GET", f.URL()+"/latest/meta-data/instance-id", nil, ""); code != 401 {
		t.Fatalf("GET without token: %d, want 401", code)
	}
	if code, _, _ := do(t, "PUT", f.URL()+"/latest/api/token", nil, ""); code != 400 {
		t.Fatalf("PUT without TTL: %d, want 400", code)
	}
	code, hdr, tok := do(t, "PUT", f.URL()+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, "")
	if code != 200 || tok == "" || hdr.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds") != "21600" {
		t.Fatalf("PUT token: %d %q ttl=%q", code, tok, hdr.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds"))
	}
	tokHdr := map[string]string{"X-aws-ec2-metadata-token": tok}
	if code, _, _ := do(t, "GET", f.URL()+"/latest/meta-data/spot/instance-action", tokHdr, ""); code != 404 {
		t.Fatalf("instance-action before a notice: %d, want 404", code)
	}
	f.Terminate("terminate", time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	code, _, body := do(t, "GET", f.URL()+"/latest/meta-data/spot/instance-action", tokHdr, "")
	if want := `{"action":"terminate","time":"2030-01-02T03:04:05Z"}`; code != 200 || body != want {
		t.Fatalf("instance-action: %d %s, want %s", code, body, want)
	}
	f.Maintenance(fake.AWSEvent{EventID: "e1", Code: "system-reboot", NotBefore: time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC)})
	if _, _, body := do(t, "GET", f.URL()+"/latest/meta-data/events/maintenance/scheduled", tokHdr, ""); !strings.Contains(body, `"21 Jan 2019 09:00:43 GMT"`) {
		t.Fatalf("scheduled events use IMDS's time format: %s", body)
	}
	f.RevokeTokens()
	if code, _, _ := do(t, "GET", f.URL()+"/latest/meta-data/instance-id", tokHdr, ""); code != 401 {
		t.Fatalf("GET with a revoked token: %d, want 401", code)
	}
}

func TestGCP_HangingGET(t *testing.T) {
	f := fake.NewGCP(fake.GCPOptions{})
	defer f.Close()
	base := "http://" + f.Host() + "/computeMetadata/v1/instance/preempted"
	if code, _, _ := do(t, "GET", base, nil, ""); code != 403 {
		t.Fatalf("GET without Metadata-Flavor: %d, want 403", code)
	}
	flavor := map[string]string{"Metadata-Flavor": "Google"}
	code, hdr, body := do(t, "GET", base, flavor, "")
	if code != 200 || body != "FALSE" || hdr.Get("ETag") == "" || hdr.Get("Metadata-Flavor") != "Google" {
		t.Fatalf("GET preempted: %d %q etag=%q", code, body, hdr.Get("ETag"))
	}
	got := make(chan string, 1)
	go func() {
		_, _, b := do(t, "GET", base+"?wait_for_change=true&last_etag="+hdr.Get("ETag"), flavor, "")
		got <- b
	}()
	select {
	case b := <-got:
		t.Fatalf("hanging GET returned %q before a change", b)
	case <-time.After(50 * time.Millisecond): // checking it hangs, not synchronising
	}
	f.Preempt()
	select {
	case b := <-got:
		if b != "TRUE" {
			t.Fatalf("hanging GET returned %q, want TRUE", b)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("hanging GET did not return after the change")
	}
}

func TestAzure_HeadersAndAcks(t *testing.T) {
	f := fake.NewAzure(fake.AzureOptions{})
	defer f.Close()
	url := f.URL() + "/metadata/scheduledevents?api-version=2020-07-01"
	if code, _, _ := do(t, "GET", url, nil, ""); code != 400 {
		t.Fatalf("GET without Metadata: true: %d, want 400", code)
	}
	md := map[string]string{"Metadata": "true"}
	if code, _, _ := do(t, "GET", f.URL()+"/metadata/scheduledevents", md, ""); code != 400 {
		t.Fatalf("GET without api-version: %d, want 400", code)
	}
	ev, _ := f.Preempt()
	_, _, body := do(t, "GET", url, md, "")
	if !strings.Contains(body, `"DocumentIncarnation":2`) || !strings.Contains(body, ev.EventId) || !strings.Contains(body, " GMT") {
		t.Fatalf("document: %s", body)
	}
	if code, _, _ := do(t, "POST", url, md, `{"StartRequests":[{"EventId":"`+ev.EventId+`"}]}`); code != 200 {
		t.Fatalf("ack: %d, want 200", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := f.WaitAck(ctx, ev.EventId); err != nil {
		t.Fatal(err)
	}
	if _, _, body := do(t, "GET", url, md, ""); !strings.Contains(body, `"EventStatus":"Started"`) {
		t.Fatalf("acked event not Started: %s", body)
	}
}

func TestStart(t *testing.T) {
	for _, cloud := range []string{"aws", "gcp", "azure"} {
		s, err := fake.Start(cloud, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if name, value := s.Env(); name == "" || value == "" {
			t.Errorf("%s: empty env %q=%q", cloud, name, value)
		}
		if at := s.Notice(); at.IsZero() || !s.LastExposed().Equal(at) {
			t.Errorf("%s: Notice()=%v, LastExposed()=%v", cloud, at, s.LastExposed())
		}
		s.Close()
	}
	if _, err := fake.Start("oracle", "127.0.0.1:0"); err == nil {
		t.Error("Start(oracle): no error")
	}
}
