package cloud

import (
	"context"
	"fmt"
	"strings"
)

// Cleaner is implemented by stores that can remove what a crashed writer
// left behind: temp files (file) or incomplete multipart uploads (s3).
// Cleanup returns how many leftovers it removed.
type Cleaner interface {
	Cleanup(ctx context.Context) (int, error)
}

// ValidKey reports whether key keeps the Store key rules: not empty,
// "/"-separated, no leading "/", no empty, "." or ".." elements.
func ValidKey(key string) error {
	if key == "" {
		return fmt.Errorf("empty key")
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return fmt.Errorf("invalid key %q", key)
		}
	}
	return nil
}
