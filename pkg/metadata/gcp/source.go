// Package gcp watches the GCE metadata server for preemption and host
// maintenance, with hanging GETs (wait_for_change and the last ETag), so a
// notice arrives within milliseconds rather than a poll period.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	gce "cloud.google.com/go/compute/metadata"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Config configures a Source. Zero fields take the defaults shown.
type Config struct {
	// Host of the metadata server, host:port. Empty: GCE_METADATA_HOST,
	// else 169.254.169.254.
	Host string
	// PreemptGrace is the deadline of a preemption after it is seen (30s).
	PreemptGrace time.Duration
	// MaintenanceGrace is the deadline of a maintenance event after it is
	// seen (60s: GCE warns 60 s ahead).
	MaintenanceGrace time.Duration
	// RequestTimeout bounds a plain GET, and the wait for the first byte
	// of a hanging GET beyond WaitTimeout (2s).
	RequestTimeout time.Duration
	// WaitTimeout is the timeout_sec asked of a hanging GET (60s).
	WaitTimeout time.Duration
	// MaxBackoff is the longest pause between retries while the server
	// fails (10s).
	MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = os.Getenv(hostEnv)
	}
	if c.Host == "" {
		c.Host = defaultHost
	}
	c.Host = strings.TrimSuffix(strings.TrimPrefix(c.Host, "http://"), "/")
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.PreemptGrace, 30*time.Second)
	def(&c.MaintenanceGrace, 60*time.Second)
	def(&c.RequestTimeout, 2*time.Second)
	def(&c.WaitTimeout, 60*time.Second)
	def(&c.MaxBackoff, 10*time.Second)
	return c
}

// Source watches the GCE metadata server. It is safe for concurrent use.
type Source struct {
	cfg Config
	log *zap.Logger
	hc  *http.Client
	lib *gce.Client // identity reads
}

var _ metadata.Source = (*Source)(nil)

// New returns a Source; it does no I/O.
func New(cfg Config, log *zap.Logger) *Source {
	if log == nil {
		log = zap.NewNop()
	}
	cfg = cfg.withDefaults()
	tr := &http.Transport{
		Proxy:               nil, // the metadata server is link-local: never proxied
		DialContext:         (&net.Dialer{Timeout: cfg.RequestTimeout}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	s := &Source{cfg: cfg, log: log.With(zap.String("cloud", "gcp")), hc: &http.Client{Transport: tr}}
	// The library reads GCE_METADATA_HOST itself; point it at cfg.Host.
	s.lib = gce.NewClient(&http.Client{Transport: hostRewriter{host: cfg.Host, next: tr}})
	return s
}

type hostRewriter struct {
	host string
	next http.RoundTripper
}

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = h.host, h.host
	return h.next.RoundTrip(r)
}

// Cloud returns gcp.
func (s *Source) Cloud() metadata.Cloud { return metadata.CloudGCP }

// Identity reads the instance id, name, machine type, zone and whether the
// instance is preemptible (spot).
func (s *Source) Identity(ctx context.Context) (metadata.Identity, error) {
	id := metadata.Identity{Cloud: metadata.CloudGCP}
	ctx, cancel := context.WithTimeout(ctx, 4*s.cfg.RequestTimeout)
	defer cancel()
	var err error
	if id.InstanceID, err = s.lib.InstanceIDWithContext(ctx); err != nil {
		return id, fmt.Errorf("identity: %w", err)
	}
	if id.Name, err = s.lib.InstanceNameWithContext(ctx); err != nil {
		return id, fmt.Errorf("identity: %w", err)
	}
	if id.Zone, err = s.lib.ZoneWithContext(ctx); err != nil {
		return id, fmt.Errorf("identity: %w", err)
	}
	mt, err := s.lib.GetWithContext(ctx, keyMachineType)
	if err != nil {
		return id, fmt.Errorf("identity: %w", err)
	}
	id.InstanceType = mt[strings.LastIndex(mt, "/")+1:]
	id.Lifecycle = "on-demand"
	if p, err := s.lib.GetWithContext(ctx, keyPreemptible); err == nil && strings.TrimSpace(p) == "TRUE" {
		id.Lifecycle = "preemptible"
	}
	return id, nil
}

// Probe reports whether a GCE metadata server answers (it must say
// Metadata-Flavor: Google).
func (s *Source) Probe(ctx context.Context) error {
	_, _, err := s.fetch(ctx, keyInstanceID, "")
	return err
}

var errNoETag = errors.New("answer without etag")

// fetch GETs key. With lastETag set, it is a hanging GET that returns once
// the value's ETag differs from lastETag or the server's wait times out.
func (s *Source) fetch(ctx context.Context, key, lastETag string) (value, etag string, err error) {
	u := "http://" + s.cfg.Host + basePath + key
	timeout := s.cfg.RequestTimeout
	if lastETag != "" {
		q := url.Values{"wait_for_change": {"true"}, "last_etag": {lastETag},
			"timeout_sec": {strconv.Itoa(int(s.cfg.WaitTimeout / time.Second))}}
		u += "?" + q.Encode()
		timeout += s.cfg.WaitTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", "", fmt.Errorf("get %s: %w", key, err)
	}
	req.Header.Set(flavorKey, flavorValue)
	resp, err := s.hc.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("get %s: %w", key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", "", fmt.Errorf("read %s: %w", key, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("get %s: status %d", key, resp.StatusCode)
	}
	if resp.Header.Get(flavorKey) != flavorValue {
		return "", "", fmt.Errorf("get %s: not a GCE metadata server (no %s header)", key, flavorKey)
	}
	return strings.TrimSpace(string(body)), resp.Header.Get("ETag"), nil
}
