// Package cloud defines the Store interface that every checkpoint backend
// (file, s3, gcs) implements, and the errors they share.
package cloud

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotExist is returned (wrapped or bare) by every Store method when the
// object does not exist. Compare with errors.Is.
var ErrNotExist = errors.New("object does not exist")

// ErrPrecondition is returned by Put when a conditional write lost: the
// object already exists (PutOptions.IfAbsent) or changed since it was read
// (PutOptions.IfVersion).
var ErrPrecondition = errors.New("precondition failed")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key      string    // relative to the store root, "/"-separated
	Size     int64     // bytes
	Modified time.Time // last modification, as the backend reports it
	Version  string    // opaque token for PutOptions.IfVersion (ETag, generation, mtime)
}

// PutOptions makes a write conditional. The zero value writes unconditionally.
type PutOptions struct {
	// IfAbsent fails the write with ErrPrecondition when the key exists.
	IfAbsent bool
	// IfVersion, when not empty, fails the write with ErrPrecondition unless
	// the object's current Version equals it.
	IfVersion string
}

// Store is a flat namespace of objects under one root (a bucket prefix or
// a directory). Keys are relative to the root and keep the rule of
// ValidKey: "/"-separated, never starting with "/", no empty, "." or ".."
// elements, no backslash or NUL.
//
// The contract every implementation keeps (and pkg/cloud/cloudtest checks):
//   - Every method takes ctx first and returns promptly once ctx is done.
//   - A missing object is reported as ErrNotExist (possibly wrapped).
//   - Put is atomic: readers see the old object or the complete new one,
//     never a prefix. If Put fails or ctx is cancelled, no new object is
//     visible and nothing is left behind (multipart parts are aborted).
//   - Put reads r to EOF; size is the exact length, or -1 when unknown.
//   - Delete of a missing key succeeds: Delete is idempotent.
//   - List calls fn for every object whose key starts with prefix, in
//     lexical key order, across as many pages as the backend needs. An
//     error from fn stops the listing and is returned.
//   - Implementations are safe for concurrent use.
type Store interface {
	Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) error
	// Get returns length bytes of the object starting at offset; length < 0
	// reads to the end. The caller closes the reader.
	Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	Delete(ctx context.Context, key string) error
	// URI names the object for people and logs: s3://bucket/prefix/key.
	URI(key string) string
	// Close releases clients and connections.
	Close() error
}
