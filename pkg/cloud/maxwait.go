package cloud

import (
	"context"
	"time"
)

// maxWaitKey carries WithMaxWait's bound in a context.
type maxWaitKey struct{}

// WithMaxWait bounds every wait between the retries of the store
// operations made with ctx by d (d > 0), below the stores' own longest
// wait (20 s): for small writes that must land soon after the store is
// back (the run journal at exit), never for data uploads. The retry
// wrapper (pkg/cloud/wrap) honours it, and so does each backend's Put,
// whose requests its SDK retries.
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxWaitKey{}, d)
}

// MaxWait is ctx's bound from WithMaxWait, or 0 when it has none.
func MaxWait(ctx context.Context) time.Duration {
	d, _ := ctx.Value(maxWaitKey{}).(time.Duration)
	return max(d, 0)
}
