// Package azure watches Azure Scheduled Events for Spot evictions and
// maintenance of this VM, and acknowledges them once the agent is ready.
package azure

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Config configures a Source. Zero fields take the defaults shown.
type Config struct {
	// Endpoint of the instance metadata service. Empty:
	// SPOTAGENT_AZURE_METADATA_ENDPOINT, else http://169.254.169.254.
	Endpoint string
	// PollInterval between two reads of the Scheduled Events (1s).
	PollInterval time.Duration
	// DefaultGrace is the deadline of a termination whose NotBefore is
	// blank or already started, counted from when it is seen (30s).
	DefaultGrace time.Duration
	// RequestTimeout bounds each request, retries included (2s).
	RequestTimeout time.Duration
	// MaxBackoff is the longest pause between polls while IMDS fails (10s).
	MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.Endpoint == "" {
		c.Endpoint = os.Getenv(endpointEnv)
	}
	if c.Endpoint == "" {
		c.Endpoint = defaultEndpoint
	}
	c.Endpoint = strings.TrimSuffix(c.Endpoint, "/")
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.PollInterval, time.Second)
	def(&c.DefaultGrace, 30*time.Second)
	def(&c.RequestTimeout, 2*time.Second)
	def(&c.MaxBackoff, 10*time.Second)
	return c
}

// Source watches Azure Scheduled Events. It is safe for concurrent use.
type Source struct {
	cfg    Config
	log    *zap.Logger
	client *retryablehttp.Client
}

var (
	_ metadata.Source = (*Source)(nil)
	_ metadata.Acker  = (*Source)(nil)
)

// New returns a Source; it does no I/O.
func New(cfg Config, log *zap.Logger) *Source {
	if log == nil {
		log = zap.NewNop()
	}
	cfg = cfg.withDefaults()
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: &http.Transport{
		Proxy:               nil, // IMDS is link-local: never proxied
		DialContext:         (&net.Dialer{Timeout: cfg.RequestTimeout}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}}
	rc.RetryMax = 2
	rc.RetryWaitMin = 20 * time.Millisecond
	rc.RetryWaitMax = 200 * time.Millisecond
	rc.Logger = nil // failures are logged by the poll loop, with backoff
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return &Source{cfg: cfg, log: log.With(zap.String("cloud", "azure")), client: rc}
}

// Cloud returns azure.
func (s *Source) Cloud() metadata.Cloud { return metadata.CloudAzure }

// instance is the part of the instance document spotagent reads.
type instance struct {
	Compute struct {
		Name     string `json:"name"`
		VMID     string `json:"vmId"`
		VMSize   string `json:"vmSize"`
		Location string `json:"location"`
		Zone     string `json:"zone"`
		Priority string `json:"priority"`
	} `json:"compute"`
}

func (s *Source) instance(ctx context.Context) (instance, error) {
	var in instance
	body, err := s.do(ctx, http.MethodGet, pathInstance, nil)
	if err != nil {
		return in, err
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return in, fmt.Errorf("parse instance metadata: %w", err)
	}
	if in.Compute.Name == "" {
		return in, errors.New("parse instance metadata: no compute.name")
	}
	return in, nil
}

// Identity reads the VM's name, id, size, location/zone and priority.
// Zone is "location-zone" ("eastus-1"), or the location without zones.
func (s *Source) Identity(ctx context.Context) (metadata.Identity, error) {
	in, err := s.instance(ctx)
	if err != nil {
		return metadata.Identity{Cloud: metadata.CloudAzure}, fmt.Errorf("identity: %w", err)
	}
	c := in.Compute
	zone := c.Location
	if c.Zone != "" {
		zone += "-" + c.Zone
	}
	return metadata.Identity{Cloud: metadata.CloudAzure, InstanceID: c.VMID, InstanceType: c.VMSize,
		Zone: zone, Lifecycle: strings.ToLower(c.Priority), Name: c.Name}, nil
}

// Probe reports whether an Azure IMDS answers with an instance document.
func (s *Source) Probe(ctx context.Context) error {
	_, err := s.instance(ctx)
	return err
}

// Ack approves event noticeID (a Notice.ID from this source) with a
// StartRequests POST: Azure may then go ahead at once, and the replacement
// machine comes sooner. An IMDS that fails (unreachable, 5xx, 429) is asked
// again, 100 ms after the first failure and then twice as long each time
// (at most 2 s, or MaxBackoff if shorter), until ctx ends: the caller bounds it by the event's
// deadline. Any other answer (a 4xx: the event is gone, or the body was
// refused) is final.
func (s *Source) Ack(ctx context.Context, noticeID string) error {
	body, err := json.Marshal(map[string]any{"StartRequests": []map[string]string{{"EventId": noticeID}}})
	if err != nil {
		return fmt.Errorf("ack %s: %w", noticeID, err)
	}
	wait, attempts := 100*time.Millisecond, 0
	var last error // the last attempt's failure that ctx did not cut short
	for {
		_, err := s.do(ctx, http.MethodPost, pathScheduledEvents, body)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			attempts, last = attempts+1, err
		}
		if ctx.Err() != nil || !transient(err) {
			return fmt.Errorf("ack %s (%d attempts): %w", noticeID, attempts, last)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ack %s (%d attempts): %w", noticeID, attempts, last)
		case <-t.C:
		}
		wait = min(2*wait, s.cfg.MaxBackoff, 2*time.Second)
	}
}

// statusError is an answer other than 200.
type statusError struct {
	method, path string
	code         int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: status %d", e.method, e.path, e.code)
}

// transient: err may pass if asked again (no answer, 5xx, 429).
func transient(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.code >= 500 || se.code == http.StatusTooManyRequests
	}
	return true
}

// do sends one request within RequestTimeout and returns the body of a 200.
func (s *Source) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, s.cfg.Endpoint+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Metadata", "true")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &statusError{method: method, path: path, code: resp.StatusCode}
	}
	return out, nil
}
