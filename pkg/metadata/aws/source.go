// Package aws watches the EC2 instance metadata service (IMDSv2) for spot
// interruption notices, rebalance recommendations, scheduled maintenance and
// Auto Scaling termination.
package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Config configures a Source. Zero fields take the defaults shown.
type Config struct {
	// Endpoint of IMDS, e.g. http://127.0.0.1:1338. Empty: the SDK's
	// choice (AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254).
	Endpoint string
	// PollInterval between two reads of the notice paths (1s).
	PollInterval time.Duration
	// SpotPollInterval between two reads of spot/instance-action, the one
	// notice with a fixed two-minute deadline (250ms; never more than
	// PollInterval). The other paths are read every PollInterval.
	SpotPollInterval time.Duration
	// RequestTimeout bounds each IMDS call, token PUT included (2s): a token
	// PUT dropped by the hop limit in a container cannot block the watch.
	RequestTimeout time.Duration
	// MaxBackoff is the longest pause between polls while IMDS fails (10s).
	MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.SpotPollInterval <= 0 {
		c.SpotPollInterval = 250 * time.Millisecond
	}
	c.SpotPollInterval = min(c.SpotPollInterval, c.PollInterval)
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 2 * time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 10 * time.Second
	}
	return c
}

// Source watches EC2 IMDS. It is safe for concurrent use.
type Source struct {
	cfg    Config
	log    *zap.Logger
	client *imds.Client
}

var _ metadata.Source = (*Source)(nil)

// New returns a Source; it does no I/O.
func New(cfg Config, log *zap.Logger) *Source {
	if log == nil {
		log = zap.NewNop()
	}
	cfg = cfg.withDefaults()
	client := imds.New(imds.Options{
		// AWS_EC2_METADATA_DISABLED is about the SDK's credential lookups;
		// watching for notices is what this source was opened for.
		ClientEnableState: imds.ClientEnabled,
		Endpoint:          cfg.Endpoint,
		HTTPClient:        newHTTPClient(cfg.RequestTimeout),
		// One quick retry, so that a 401 (expired token) is retried at once
		// with a fresh token; the poll loop does the slower retries.
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 2
			o.RateLimiter = ratelimit.None
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) {
				return 10 * time.Millisecond, nil
			})
		}),
		DisableDefaultTimeout:    true, // RequestTimeout applies instead
		DisableDefaultMaxBackoff: true, // it would replace the 10ms above with up to 1s
	})
	return &Source{cfg: cfg, log: log.With(zap.String("cloud", "aws")), client: client}
}

// newHTTPClient never goes through a proxy: IMDS is link-local.
func newHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
	}}
}

// Cloud returns aws.
func (s *Source) Cloud() metadata.Cloud { return metadata.CloudAWS }

// Identity reads instance-id, instance-type, availability zone and
// instance-life-cycle.
func (s *Source) Identity(ctx context.Context) (metadata.Identity, error) {
	id := metadata.Identity{Cloud: metadata.CloudAWS}
	for _, f := range []struct {
		path string
		dst  *string
	}{
		{pathInstanceID, &id.InstanceID},
		{pathInstanceType, &id.InstanceType},
		{pathZone, &id.Zone},
		{pathLifecycleType, &id.Lifecycle},
	} {
		body, found, err := s.get(ctx, f.path)
		if err != nil {
			return id, fmt.Errorf("identity: %w", err)
		}
		if found {
			*f.dst = strings.TrimSpace(string(body))
		}
	}
	return id, nil
}

// Probe reports whether an EC2 IMDS answers: instance-id must read back
// as an instance ID.
func (s *Source) Probe(ctx context.Context) error {
	body, found, err := s.get(ctx, pathInstanceID)
	if err != nil {
		return err
	}
	if v := string(body); !found || !strings.HasPrefix(v, "i-") || strings.ContainsAny(v, " \n<") {
		return errors.New("probe: no instance id")
	}
	return nil
}

// get reads one meta-data path within RequestTimeout. found is false on 404.
func (s *Source) get(ctx context.Context, path string) (body []byte, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	out, err := s.client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		if httpStatus(err) == http.StatusNotFound {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("get %s: %w", path, err)
	}
	defer out.Content.Close()
	body, err = io.ReadAll(io.LimitReader(out.Content, 1<<20))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	return body, true, nil
}

// httpStatus returns the HTTP status carried by err, or 0 when the request
// got no answer at all.
func httpStatus(err error) int {
	var se interface{ HTTPStatusCode() int }
	if errors.As(err, &se) {
		return se.HTTPStatusCode()
	}
	return 0
}
