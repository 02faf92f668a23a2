// Package noticetest is a notice source the test feeds: the agent's view of
// a cloud is only the metadata.Source interface; the clouds' wires are
// tested in pkg/metadata (and pkg/metadata/fake serves them over HTTP).
package noticetest

import (
	"context"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// Source is an AWS source that delivers the notices sent on C.
type Source struct{ C chan metadata.Notice }

// New is a Source whose channel holds buf notices.
func New(buf int) *Source { return &Source{C: make(chan metadata.Notice, buf)} }

// Cloud is AWS.
func (f *Source) Cloud() metadata.Cloud { return metadata.CloudAWS }

// Identity is an AWS identity with nothing else known.
func (f *Source) Identity(context.Context) (metadata.Identity, error) {
	return metadata.Identity{Cloud: metadata.CloudAWS}, nil
}

// Watch forwards the notices sent on C until ctx ends.
func (f *Source) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-f.C:
			out <- n
		}
	}
}
