package s3

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Cleanup implements cloud.Cleaner: it aborts incomplete multipart uploads
// under the prefix.
func (s *Store) Cleanup(ctx context.Context) (int, error) { return s.AbortIncompleteUploads(ctx) }

// AbortIncompleteUploads aborts every multipart upload under the store's
// prefix that was started and never completed (a writer crashed), and
// returns how many it aborted. Run it at start: it also aborts uploads that
// another live writer under the same prefix has in flight.
func (s *Store) AbortIncompleteUploads(ctx context.Context) (int, error) {
	n := 0
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
