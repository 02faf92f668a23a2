package cloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Cleaner is implemented by stores that can remove what a crashed writer
// left behind: temp files (file) or incomplete multipart uploads (s3).
// Cleanup returns how many leftovers it removed.
type Cleaner interface {
	Cleanup(ctx context.Context) (int, error)
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
