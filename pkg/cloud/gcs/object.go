package gcs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Get returns a range reader.
func (s *Store) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	o, err := s.object(key)
	if err != nil {
		return nil, err
	}
	if length == 0 {
		return cloud.EmptyGet(ctx, s, key)
	}
	r, err := o.NewRangeReader(ctx, offset, length)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, translate(err))
	}
	return r, nil
}

// Stat returns the object's size, time and generation (the version token).
func (s *Store) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	o, err := s.object(key)
	if err != nil {
		return cloud.ObjectInfo{}, err
	}
	a, err := o.Attrs(ctx)
	if err != nil {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, translate(err))
	}
	return s.info(a), nil
}

func (s *Store) info(a *storage.ObjectAttrs) cloud.ObjectInfo {
	return cloud.ObjectInfo{
		Key: strings.TrimPrefix(a.Name, s.prefix), Size: a.Size,
		Modified: a.Updated, Version: strconv.FormatInt(a.Generation, 10),
	}
}

// List iterates the objects under prefix; GCS returns them in lexical order.
func (s *Store) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	q := &storage.Query{Prefix: s.prefix + prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Updated", "Generation"}); err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	it := s.bucket.Objects(ctx, q)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", prefix, translate(err))
		}
		if err := fn(s.info(a)); err != nil {
			return err
		}
	}
}

// Delete removes the object; a missing one is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	o, err := s.object(key)
	if err != nil {
		return err
	}
	if err := o.Delete(ctx); err != nil {
		if err = translate(err); !errors.Is(err, cloud.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", key, err)
		}
	}
	return nil
}
