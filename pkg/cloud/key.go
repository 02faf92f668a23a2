package cloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

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
