package azblob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
)

// Put's attempts retry what the SDK's retry policy retried before they
// replaced it: a retryable status, and any error of the transport (a body
// cut short, a reset, a closed connection), never the context's.
func TestSendRetryable(t *testing.T) {
	s := &Store{}
	retry := sendRetryable(s.Retryable)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&azcore.ResponseError{StatusCode: http.StatusServiceUnavailable}, true},
		{&azcore.ResponseError{StatusCode: http.StatusTooManyRequests}, true},
		{&azcore.ResponseError{StatusCode: http.StatusForbidden}, false},
		{&azcore.ResponseError{StatusCode: http.StatusPreconditionFailed}, false},
		{fmt.Errorf("send: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("send: %w", io.EOF), true},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), true},
		{context.Canceled, false},
		{fmt.Errorf("send: %w", context.DeadlineExceeded), false},
		{errors.New("http: ContentLength=10 with Body length 4"), true},
	} {
		if got := retry(tc.err); got != tc.want {
			t.Errorf("%v: retried %v, want %v", tc.err, got, tc.want)
		}
	}
}
