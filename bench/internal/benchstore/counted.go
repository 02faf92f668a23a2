package benchstore

import (
	"context"
	"io"
	"sync/atomic"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Counted counts a store's requests (List as one) and the bytes written
// and read through it.
type Counted struct {
	cloud.Store
	Requests, Written, Read atomic.Int64
}

// Reset zeroes the counts.
func (c *Counted) Reset() { c.Requests.Store(0); c.Written.Store(0); c.Read.Store(0) }

func (c *Counted) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	c.Requests.Add(1)
	c.Written.Add(size)
	return c.Store.Put(ctx, key, r, size, opts)
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

func (c *Counted) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.Requests.Add(1)
	rc, err := c.Store.Get(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return countingReader{rc, &c.Read}, nil
}

func (c *Counted) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	c.Requests.Add(1)
	return c.Store.Stat(ctx, key)
}

func (c *Counted) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	c.Requests.Add(1)
	return c.Store.List(ctx, prefix, fn)
}

func (c *Counted) Delete(ctx context.Context, key string) error {
	c.Requests.Add(1)
	return c.Store.Delete(ctx, key)
}
