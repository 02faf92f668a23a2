package detect

import (
	"context"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// None is the source of a machine without a cloud metadata service: it
// never delivers a notice (OS signals still trigger a final checkpoint).
type None struct{}

var _ metadata.Source = None{}

// Cloud returns none.
func (None) Cloud() metadata.Cloud { return metadata.CloudNone }

// Identity returns an identity with Cloud none.
func (None) Identity(context.Context) (metadata.Identity, error) {
	return metadata.Identity{Cloud: metadata.CloudNone}, nil
}

// Watch blocks until ctx ends and returns nil.
func (None) Watch(ctx context.Context, _ chan<- metadata.Notice) error {
	<-ctx.Done()
	return nil
}
