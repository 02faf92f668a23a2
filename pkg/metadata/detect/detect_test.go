package detect_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/detect"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
)

// everywhere points the three probes at one address, as on a real VM where
// all three clouds use 169.254.169.254: only the right one may answer.
func everywhere(url, host string) detect.Config {
	return detect.Config{AWSEndpoint: url, GCPHost: host, AzureEndpoint: url, ProbeTimeout: 2 * time.Second}
}

func TestOpen_Auto(t *testing.T) {
	aws, gcp, azure := fake.NewAWS(fake.AWSOptions{}), fake.NewGCP(fake.GCPOptions{}), fake.NewAzure(fake.AzureOptions{})
	defer aws.Close()
	defer gcp.Close()
	defer azure.Close()
	for _, tc := range []struct {
		srv interface {
			URL() string
			Addr() string
		}
		want metadata.Cloud
	}{
		{aws, metadata.CloudAWS},
		{gcp, metadata.CloudGCP},
		{azure, metadata.CloudAzure},
	} {
		t.Run(string(tc.want), func(t *testing.T) {
			src, err := detect.Open(context.Background(), "auto", everywhere(tc.srv.URL(), tc.srv.Addr()), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := src.Cloud(); got != tc.want {
				t.Fatalf("cloud=%s, want %s", got, tc.want)
			}
		})
	}
}

func TestOpen_AutoNone(t *testing.T) {
	t.Run("Refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		openNone(t, everywhere("http://"+addr, addr))
	})
	t.Run("Hanging", func(t *testing.T) {
		// A blackholed 169.254.169.254 looks like this: nothing ever answers.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addr := l.Addr().String()
		cfg := everywhere("http://"+addr, addr)
		cfg.ProbeTimeout = 300 * time.Millisecond
		openNone(t, cfg)
	})
}

func openNone(t *testing.T, cfg detect.Config) {
	t.Helper()
	start := time.Now()
	src, err := detect.Open(context.Background(), "auto", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Cloud(); got != metadata.CloudNone {
		t.Fatalf("cloud=%s, want none", got)
	}
	if d := time.Since(start); d > cfg.ProbeTimeout+5*time.Second { // slack for a loaded machine
		t.Fatalf("detection took %v, want at most about %v", d, cfg.ProbeTimeout)
	}
	id, err := src.Identity(context.Background())
	if err != nil || id.Cloud != metadata.CloudNone {
		t.Fatalf("identity=%+v, %v; want cloud none", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx, make(chan metadata.Notice)) }()
	select {
	case err := <-done:
		t.Fatalf("none Watch returned %v before its context ended", err)
	case <-time.After(20 * time.Millisecond): // checking it blocks, not synchronising
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("none Watch returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("none Watch still running after its context ended")
	}
}

func TestOpen_Named(t *testing.T) {
	for _, name := range []string{"aws", "gcp", "azure", "none"} {
		src, err := detect.Open(context.Background(), name, detect.Config{}, nil)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		if got := string(src.Cloud()); got != name {
			t.Fatalf("open %s: cloud=%s", name, got)
		}
	}
	if _, err := detect.Open(context.Background(), "oracle", detect.Config{}, nil); err == nil {
		t.Fatal("open oracle: no error")
	}
}
