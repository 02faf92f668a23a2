package azblob

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// errTransport marks a connection that broke mid-response.
var errTransport = errors.New("connection broke")

// translate maps Azure errors to the cloud sentinels, keeping the original
// in the chain for logs. Check adds the credential that was tried; an
// account whose host does not resolve is named (no such storage account).
func (s *Store) translate(err error) error {
	if err == nil {
		return nil
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return s.translateResponse(re.StatusCode, bloberror.Code(re.ErrorCode), responseError{re})
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return fmt.Errorf("%w: storage account %q: no such host %s: %w", cloud.ErrUnreachable, s.account, dnsErr.Name, err)
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		return fmt.Errorf("%w: %w", cloud.ErrUnreachable, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", errTransport, err)
	}
	return err
}

func (s *Store) translateResponse(status int, code bloberror.Code, err error) error {
	switch {
	case code == bloberror.ContainerNotFound:
		return fmt.Errorf("%w: container %q in account %q: %w", cloud.ErrBucketNotFound, s.container, s.account, err)
	case code == bloberror.BlobNotFound || status == http.StatusNotFound && code != bloberror.ResourceNotFound:
		return fmt.Errorf("%w: %w", cloud.ErrNotExist, err)
	case code == bloberror.ResourceNotFound:
		// Azurite's answer for an account it does not serve.
		return fmt.Errorf("%w: account %q: %w", cloud.ErrBucketNotFound, s.account, err)
	case code == bloberror.ConditionNotMet || code == bloberror.BlobAlreadyExists || status == http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %w", cloud.ErrPrecondition, err)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		if strings.HasPrefix(s.cred, "SAS") {
			return fmt.Errorf("%w (has the SAS expired, or does it lack a permission?): %w", cloud.ErrAccessDenied, err)
		}
		return fmt.Errorf("%w: %w", cloud.ErrAccessDenied, err)
	}
	return err
}

// responseError is the SDK's error on one line: the SDK's own message
// spans a dozen, with the response body, which a CLI error or a log field
// should not. The original stays in the chain (errors.As).
type responseError struct{ re *azcore.ResponseError }

func (e responseError) Error() string {
	what := ""
	if r := e.re.RawResponse; r != nil && r.Request != nil {
		what = r.Request.Method + " " + r.Request.URL.Path + ": "
	}
	code := e.re.ErrorCode
	if code == "" {
		code = http.StatusText(e.re.StatusCode)
	}
	return fmt.Sprintf("%s%d %s", what, e.re.StatusCode, code)
}

func (e responseError) Unwrap() error { return e.re }
