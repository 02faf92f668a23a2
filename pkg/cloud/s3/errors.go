package s3

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// translate maps S3 errors to the cloud sentinels, keeping the original
// in the chain for logs.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if e := explainConfig(err); e != err {
		return e
	}
	var apiErr smithy.APIError
	code := ""
	if errors.As(err, &apiErr) {
		code = apiErr.ErrorCode()
	}
	status := 0
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) {
		status = respErr.HTTPStatusCode()
	}
	switch {
	case code == "NoSuchBucket":
		return fmt.Errorf("%w: %w", cloud.ErrBucketNotFound, err)
	case code == "NoSuchKey" || code == "NotFound" || status == http.StatusNotFound:
		return fmt.Errorf("%w: %w", cloud.ErrNotExist, err)
	case code == "PreconditionFailed" || code == "ConditionalRequestConflict" ||
		status == http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %w", cloud.ErrPrecondition, err)
	case code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
		code == "ExpiredToken" || code == "InvalidToken" || status == http.StatusForbidden:
		return fmt.Errorf("%w: %w", cloud.ErrAccessDenied, err)
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		return fmt.Errorf("%w: %w", cloud.ErrUnreachable, err)
	}
	return err
}

// Errors of the SDK's configuration chain, named for what is missing and
// where the SDK looks for it. The SDK gives them no type of its own (a
// credentials chain's failure is fmt.Errorf text, an empty region an
// endpoint rule's message): they are matched on that text here, in one
// place, and the SDK's error stays in the chain.
var (
	// ErrNoRegion: no region configured, and the bucket's could not be asked.
	ErrNoRegion = errors.New("no AWS region found (looked in AWS_REGION, AWS_DEFAULT_REGION and the profile's region in ~/.aws/config): set AWS_REGION to the bucket's region")
	// ErrBadRegion: the configured region is no region name.
	ErrBadRegion = errors.New("AWS region is not a valid region name (check AWS_REGION, AWS_DEFAULT_REGION and the profile's region in ~/.aws/config)")
	// ErrNoCredentials: the chain found no credentials.
	ErrNoCredentials = errors.New("no AWS credentials found (looked in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws/credentials, web identity (AWS_WEB_IDENTITY_TOKEN_FILE, IRSA), the container's and the EC2 instance's role)")
)

// explainConfig names a configuration failure of the SDK (ErrNoRegion,
// ErrBadRegion, ErrNoCredentials), wrapping err; other errors are
// returned as they are.
func explainConfig(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Invalid region: region was not a valid DNS name") && strings.Contains(msg, "resolve endpoint"):
		return fmt.Errorf("%w: %w", ErrNoRegion, err)
	case strings.Contains(msg, "invalid input region"), strings.Contains(msg, "Invalid region"):
		return fmt.Errorf("%w: %w", ErrBadRegion, err)
	case strings.Contains(msg, "get credentials:") || strings.Contains(msg, "failed to refresh cached credentials") ||
		strings.Contains(msg, "no EC2 IMDS role found"):
		return fmt.Errorf("%w: %w", ErrNoCredentials, err)
	}
	return err
}
