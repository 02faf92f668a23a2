package faultproxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// backend counts the requests it completed, answers PUT with the number of
// body bytes it read and GET /big/N with N bytes.
type backend struct {
	*httptest.Server
	done atomic.Int64
}

func newBackend(t *testing.T) *backend {
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		if strings.HasPrefix(r.URL.Path, "/big/") {
			size, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/big/"))
			b.done.Add(1)
			w.Header().Set("Content-Length", strconv.Itoa(size))
			w.Write(bytes.Repeat([]byte{'x'}, size))
			return
		}
		b.done.Add(1) // before the answer: the client may see it at once
		w.Header().Set("Location", "http://"+r.Host+"/moved?x=1")
		io.WriteString(w, strconv.FormatInt(n, 10))
	}))
	t.Cleanup(b.Close)
	return b
}

func do(t *testing.T, method, url string, body []byte) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// A fresh connection each time: a reset must not poison the next request.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func TestProxy_Pass(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	resp, body, err := do(t, "PUT", p.URL+"/obj", make([]byte, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(body), "100000"; got != want {
		t.Fatalf("backend read %s bytes, want %s", got, want)
	}
	// Locations the target builds from Host point back at the proxy.
	if got, want := resp.Header.Get("Location"), p.URL+"/moved?x=1"; got != want {
		t.Fatalf("Location=%q, want %q", got, want)
	}
	if _, body, err = do(t, "GET", p.URL+"/big/1048576", nil); err != nil || len(body) != 1<<20 {
		t.Fatalf("GET: %d bytes, %v", len(body), err)
	}
	if s := p.Stats(); s.Requests != 2 || s.Faults != 0 {
		t.Fatalf("stats %+v, want 2 requests, no faults", s)
	}
}

func TestProxy_ErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		mode   faultproxy.Mode
		status int
		code   string
	}{
		{faultproxy.SlowDown, 503, "<Code>SlowDown</Code>"},
		{faultproxy.InternalError, 500, "<Code>InternalError</Code>"},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			be := newBackend(t)
			p := faultproxy.New(t, be.URL)
			p.Set(faultproxy.Fault{Mode: tc.mode, Count: 2})
			for i := range 3 {
				resp, body, err := do(t, "PUT", p.URL+"/obj", []byte("hello"))
				if err != nil {
					t.Fatal(err)
				}
				want := tc.status
				if i == 2 {
					want = 200 // the count is used up
				}
				if resp.StatusCode != want {
					t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want)
				}
				if want != 200 && !strings.Contains(string(body), tc.code) {
					t.Fatalf("request %d: body %q lacks %s", i, body, tc.code)
				}
			}
			if got, want := be.done.Load(), int64(1); got != want {
				t.Fatalf("backend served %d requests, want %d", got, want)
			}
			if got := p.Stats().Faults; got != 2 {
				t.Fatalf("faults=%d, want 2", got)
			}
		})
	}
}

func TestProxy_ResetRequest(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	p.Set(faultproxy.Fault{Mode: faultproxy.ResetRequest, After: 64 << 10})
	if _, _, err := do(t, "PUT", p.URL+"/obj", make([]byte, 1<<20)); err == nil {
		t.Fatal("PUT through a reset succeeded")
	}
	if got := be.done.Load(); got != 0 {
		t.Fatalf("backend served %d requests, want 0", got)
	}
}

func TestProxy_ResetResponse(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	t.Run("MidBody", func(t *testing.T) {
		p.Set(faultproxy.Fault{Mode: faultproxy.ResetResponse, After: 4096})
		resp, body, err := do(t, "GET", p.URL+"/big/1048576", nil)
		if err == nil {
			t.Fatalf("GET read %d bytes without error", len(body))
		}
		if resp == nil || resp.StatusCode != 200 || len(body) >= 4096 {
			t.Fatalf("want the head and part of the body, got resp=%v body=%d err=%v", resp, len(body), err)
		}
	})
	t.Run("LostAnswer", func(t *testing.T) {
		before := be.done.Load()
		p.Set(faultproxy.Fault{Mode: faultproxy.ResetResponse, After: 0})
		if _, _, err := do(t, "PUT", p.URL+"/obj", []byte("hello")); err == nil {
			t.Fatal("PUT through a reset succeeded")
		}
		// The target did the work: only the answer was lost.
		if got := be.done.Load() - before; got != 1 {
			t.Fatalf("backend served %d requests, want 1", got)
		}
	})
}

func TestProxy_Stall(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	p.Set(faultproxy.Fault{Mode: faultproxy.Stall, Stall: 300 * time.Millisecond, Count: 1})
	start := time.Now()
	if resp, _, err := do(t, "PUT", p.URL+"/obj", []byte("a")); err != nil || resp.StatusCode != 200 {
		t.Fatalf("stalled PUT: %v %v", resp, err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("stalled request took %s, want >= 300ms", took)
	}
	// Switching the fault releases a request held for an hour.
	p.Set(faultproxy.Fault{Mode: faultproxy.Stall, Stall: time.Hour})
	errc := make(chan error, 1)
	go func() {
		_, _, err := do(t, "PUT", p.URL+"/obj", []byte("b"))
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Faults < 2 {
		if time.Now().After(deadline) {
			t.Fatal("request never reached the proxy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Clear()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stalled request not released by Clear")
	}
}

func TestProxy_Slow(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	p.Set(faultproxy.Fault{Mode: faultproxy.Slow, Rate: 256 << 10})
	start := time.Now()
	if _, body, err := do(t, "PUT", p.URL+"/obj", make([]byte, 128<<10)); err != nil || string(body) != "131072" {
		t.Fatalf("slow PUT: %q %v", body, err)
	}
	if took := time.Since(start); took < 450*time.Millisecond {
		t.Fatalf("128 KiB at 256 KiB/s took %s, want >= 0.45s", took)
	}
	start = time.Now()
	if _, body, err := do(t, "GET", p.URL+"/big/131072", nil); err != nil || len(body) != 128<<10 {
		t.Fatalf("slow GET: %d %v", len(body), err)
	}
	if took := time.Since(start); took < 450*time.Millisecond {
		t.Fatalf("128 KiB download at 256 KiB/s took %s, want >= 0.45s", took)
	}
}

func TestProxy_FractionAndMatch(t *testing.T) {
	be := newBackend(t)
	p := faultproxy.New(t, be.URL)
	p.Set(faultproxy.Fault{Mode: faultproxy.InternalError, Fraction: 0.5,
		Match: func(r *http.Request) bool { return r.Method == http.MethodPut }})
	failed := 0
	for range 200 {
		resp, _, err := do(t, "PUT", p.URL+"/obj", []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == 500 {
			failed++
		}
	}
	if failed < 60 || failed > 140 {
		t.Fatalf("%d of 200 requests failed at fraction 0.5", failed)
	}
	if resp, _, err := do(t, "GET", p.URL+"/big/10", nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET does not match the fault but got %v %v", resp, err)
	}
}

// TestProxy_S3Retries: the S3 backend retries through SlowDown, 500 and
// resets and the object lands whole.
func TestProxy_S3Retries(t *testing.T) {
	srv := s3test.New(t)
	p := faultproxy.New(t, srv.Endpoint)
	ctx := context.Background()
	st, err := s3.New(ctx, srv.Bucket, "fp", s3.Options{Endpoint: p.URL, PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), (11<<20)/16) // three parts
	for _, f := range []faultproxy.Fault{
		{Mode: faultproxy.SlowDown, Count: 1},
		{Mode: faultproxy.InternalError, Count: 1},
		{Mode: faultproxy.ResetRequest, After: 1 << 20, Count: 1},
	} {
		t.Run(f.Mode.String(), func(t *testing.T) {
			before := p.Stats().Faults
			p.Set(f)
			if err := st.Put(ctx, "obj-"+f.Mode.String(), bytes.NewReader(data), int64(len(data)), cloud.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := p.Stats().Faults - before; got != 1 {
				t.Fatalf("faults injected %d, want 1", got)
			}
			r, err := st.Get(ctx, "obj-"+f.Mode.String(), 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes (err %v), want the %d written", len(got), err, len(data))
			}
		})
	}
}
