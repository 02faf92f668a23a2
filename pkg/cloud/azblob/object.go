package azblob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Get returns a ranged Get Blob body.
func (s *Store) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, err
	}
	if length == 0 {
		return cloud.EmptyGet(ctx, s, key)
	}
	o := &blob.DownloadStreamOptions{}
	if offset > 0 || length > 0 {
		// Count 0 reads to the end.
		o.Range = blob.HTTPRange{Offset: offset, Count: max(length, 0)}
	}
	resp, err := s.client.NewBlobClient(name).DownloadStream(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, s.translate(err))
	}
	return resp.Body, nil
}

// version is the ETag without its quotes, the same token whether a Get
// Blob Properties header or a listing reported it.
func version(e *azcore.ETag) string {
	if e == nil {
		return ""
	}
	return strings.Trim(string(*e), `"`)
}

// Stat returns Get Blob Properties' size, time and ETag (the version).
func (s *Store) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	name, err := s.name(key)
	if err != nil {
		return cloud.ObjectInfo{}, err
	}
	p, err := s.client.NewBlobClient(name).GetProperties(ctx, nil)
	if err != nil {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, s.translate(err))
	}
	return cloud.ObjectInfo{Key: key, Size: deref(p.ContentLength), Modified: deref(p.LastModified), Version: version(p.ETag)}, nil
}

// List pages through List Blobs (flat), which returns names in order.
func (s *Store) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	pager := s.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: to.Ptr(s.prefix + prefix)})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s: %w", prefix, s.translate(err))
		}
		for _, b := range page.Segment.BlobItems {
			oi := cloud.ObjectInfo{Key: strings.TrimPrefix(deref(b.Name), s.prefix)}
			if p := b.Properties; p != nil {
				oi.Size, oi.Modified, oi.Version = deref(p.ContentLength), deref(p.LastModified), version(p.ETag)
			}
			if err := fn(oi); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete removes the blob and its snapshots; a missing blob is success.
func (s *Store) Delete(ctx context.Context, key string) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	_, err = s.client.NewBlobClient(name).Delete(ctx, &blob.DeleteOptions{DeleteSnapshots: to.Ptr(blob.DeleteSnapshotsOptionTypeInclude)})
	if err = s.translate(err); err != nil && !errors.Is(err, cloud.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
