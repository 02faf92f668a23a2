// Package poll holds what the metadata sources (aws, gcp, azure)
// share in their poll loops: de-duplication, delivery and logging of
// notices, and rate-limited logging of faults. Their backoff is the
// module's one retry helper, internal/retry.
package poll

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Dedup remembers the notices already delivered, by kind and ID, so that a
// notice read twice is delivered once. Not safe for concurrent use.
type Dedup struct {
	seen map[string]struct{}
}

// First reports whether n was not seen before, and records it.
func (d *Dedup) First(n metadata.Notice) bool {
	if d.seen == nil {
		d.seen = make(map[string]struct{})
	}
	k := string(n.Kind) + "\x00" + n.ID
	if _, ok := d.seen[k]; ok {
		return false
	}
	d.seen[k] = struct{}{}
	return true
}

// Seen reports whether a notice of that kind and ID was recorded.
func (d *Dedup) Seen(kind metadata.Kind, id string) bool {
	_, ok := d.seen[string(kind)+"\x00"+id]
	return ok
}

// HashID returns a stable ID for a notice that carries none: prefix and
// the first 16 hex digits of the SHA-256 of body.
func HashID(prefix string, body []byte) string {
	sum := sha256.Sum256(body)
	return prefix + "-" + hex.EncodeToString(sum[:8])
}

// Deliver sends n on out unless ctx ends first; it reports whether n was sent.
func Deliver(ctx context.Context, out chan<- metadata.Notice, n metadata.Notice) bool {
	select {
	case out <- n:
		return true
	case <-ctx.Done():
		return false
	}
}

// LogNotice logs a delivered notice.
func LogNotice(log *zap.Logger, n metadata.Notice) {
	log.Info("notice", zap.String("kind", string(n.Kind)), zap.String("id", n.ID),
		zap.String("action", n.Action), zap.Time("deadline", n.Deadline))
}
