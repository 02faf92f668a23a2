package s3

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Cleanup implements cloud.Cleaner: it aborts incomplete multipart uploads
// under the prefix (a writer crashed), those opts spares excepted. Run it
// at start: without options it also aborts uploads that another live
// writer under the same prefix has in flight.
func (s *Store) Cleanup(ctx context.Context, opts ...cloud.CleanupOptions) (int, error) {
	return s.abortUploads(ctx, cloud.CleanupOpts(opts))
}

// abortUploads aborts the incomplete uploads under the prefix that opts
// removes (judged by the key relative to the store root and the time the
// upload was initiated).
func (s *Store) abortUploads(ctx context.Context, opts cloud.CleanupOptions) (int, error) {
	n := 0
	now := time.Now()
	in := &s3.ListMultipartUploadsInput{Bucket: &s.bucket, Prefix: aws.String(s.prefix)}
	for {
		out, err := s.client.ListMultipartUploads(ctx, in)
		if err != nil && errors.Is(translate(err), cloud.ErrNotExist) {
			// gofakes3 answers NoSuchUpload for a bucket that never had
			// an upload; S3 itself returns an empty list.
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("list multipart uploads: %w", translate(err))
		}
		for _, up := range out.Uploads {
			if !opts.Removes(s.rel(aws.ToString(up.Key)), aws.ToTime(up.Initiated), now) {
				continue // another live writer's, perhaps: not ours to abort
			}
			_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
				Bucket: &s.bucket, Key: up.Key, UploadId: up.UploadId,
			})
			if err != nil && !errors.Is(translate(err), cloud.ErrNotExist) {
				return n, fmt.Errorf("abort upload of %s: %w", aws.ToString(up.Key), translate(err))
			}
			s.log.Info("aborted incomplete upload", zap.String("key", aws.ToString(up.Key)),
				zap.Timep("initiated", up.Initiated))
			n++
		}
		if !aws.ToBool(out.IsTruncated) {
			return n, nil
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}

// rel is key relative to the store's prefix.
func (s *Store) rel(key string) string { return strings.TrimPrefix(key, s.prefix) }
