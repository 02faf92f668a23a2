package s3

import (
	"errors"
	"fmt"
	"net"
	"net/http"

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
