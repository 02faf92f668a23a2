package cloud

import "errors"

// Errors a backend's access check (Open) reports, so the CLI can print one
// clear line before it launches a trainer. Compare with errors.Is.
var (
	ErrBucketNotFound = errors.New("bucket does not exist")
	ErrAccessDenied   = errors.New("access denied")
	ErrUnreachable    = errors.New("endpoint unreachable")
)
