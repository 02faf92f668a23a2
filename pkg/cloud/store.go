// Package cloud defines the Store interface that every checkpoint backend
// (file, s3, gcs) implements, and the errors they share.
package cloud

// The Store contract every backend implements, and what they share: the
// keys' rules (ValidKey, KeyPrefix), leftovers' cleanup options, a reader
// that stops with its context, an empty object's Get.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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

// Cleaner is implemented by stores that can remove what a crashed writer
// left behind: temp files (file) or incomplete multipart uploads (s3).
// Cleanup returns how many leftovers it removed. Without options (or with
// the zero value) it removes every leftover under the store's root, also
// those of another live writer; pass at most one CleanupOptions to spare
// other writers' uploads in flight.
type Cleaner interface {
	Cleanup(ctx context.Context, opts ...CleanupOptions) (int, error)
}

// CleanupOptions limits what Cleanup removes.
type CleanupOptions struct {
	// Owned, when set, names the leftovers that are this writer's (by the
	// key being written, relative to the store root): only those are
	// removed, and any other leftover older than MaxAge.
	Owned func(key string) bool
	// MaxAge is the age from which a leftover is removed whoever owns it;
	// 0 means 24 hours. Only used with Owned.
	MaxAge time.Duration
}

// defaultCleanupAge is how old a leftover Owned does not claim must be
// before Cleanup removes it: no upload lasts a day.
const defaultCleanupAge = 24 * time.Hour

// Removes reports whether Cleanup with these options removes the leftover
// of a write of key started at started, as of now.
func (o CleanupOptions) Removes(key string, started, now time.Time) bool {
	if o.Owned == nil || o.Owned(key) {
		return true
	}
	age := o.MaxAge
	if age <= 0 {
		age = defaultCleanupAge
	}
	return !started.IsZero() && now.Sub(started) > age
}

// CleanupOpts returns the one CleanupOptions passed to a Cleanup, or the
// zero value.
func CleanupOpts(opts []CleanupOptions) CleanupOptions {
	if len(opts) == 0 {
		return CleanupOptions{}
	}
	return opts[0]
}

// ErrInvalidKey reports a key (or a path in a checkpoint) that breaks the
// key rule of ValidKey.
var ErrInvalidKey = errors.New("invalid key")

// ValidKey is the one rule for store keys and for the relative paths of a
// checkpoint's files (checkpoint.SafeRel uses it), so that a path that
// passes it can neither leave its directory on disk nor its prefix in a
// store: not empty, "/"-separated, no leading "/", no empty, "." or ".."
// element, no backslash and no NUL byte.
func ValidKey(key string) error {
	if key == "" || strings.ContainsAny(key, "\\\x00") {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return fmt.Errorf("%w: %q", ErrInvalidKey, key)
		}
	}
	return nil
}

// ContextReader returns a reader that stops reading once ctx is done, even
// if r never would: backends wrap a caller's reader with it so that a
// cancelled Put returns promptly.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// EmptyGet answers a zero-length Get for backends whose range requests
// cannot express one: ErrNotExist when st has no object at key (as Stat
// reports it), else an empty reader.
func EmptyGet(ctx context.Context, st Store, key string) (io.ReadCloser, error) {
	if _, err := st.Stat(ctx, key); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("")), nil
}

// KeyPrefix turns a bucket prefix into the form object stores keep: ""
// or without surrounding slashes and ending with "/".
func KeyPrefix(prefix string) string {
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		prefix += "/"
	}
	return prefix
}
