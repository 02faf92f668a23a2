package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Get returns a ranged GetObject body.
func (s *Store) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	if length == 0 {
		return cloud.EmptyGet(ctx, s, key)
	}
	in := &s3.GetObjectInput{Bucket: &s.bucket, Key: k}
	switch {
	case length > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, translate(err))
	}
	return out.Body, nil
}

// Stat returns HeadObject's size, time and ETag (the version token).
func (s *Store) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return cloud.ObjectInfo{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: k})
	if err != nil {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, translate(err))
	}
	return cloud.ObjectInfo{
		Key: key, Size: aws.ToInt64(out.ContentLength),
		Modified: aws.ToTime(out.LastModified), Version: aws.ToString(out.ETag),
	}, nil
}

// List pages through ListObjectsV2, which returns keys in UTF-8 byte order.
func (s *Store) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s: %w", prefix, translate(err))
		}
		for _, o := range page.Contents {
			oi := cloud.ObjectInfo{
				Key: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size),
				Modified: aws.ToTime(o.LastModified), Version: aws.ToString(o.ETag),
			}
			if err := fn(oi); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete removes the object; S3 already treats a missing key as success.
func (s *Store) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: k}); err != nil {
		if err = translate(err); !errors.Is(err, cloud.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", key, err)
		}
	}
	return nil
}
