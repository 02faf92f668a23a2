package cloud

import (
	"context"
	"io"
	"strings"
)

// ContextReader returns a reader that stops reading once ctx is done, even
// if r never would: backends wrap a caller's reader with it so that a
// cancelled Put returns promptly.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// EmptyGet answers a zero-length Get for backends whose range requests
// cannot express one: ErrNotExist when st has no object at key (as Stat
// reports it), else an empty reader.
func EmptyGet(ctx context.Context, st Store, key string) (io.ReadCloser, error) {
	if _, err := st.Stat(ctx, key); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("")), nil
}

// KeyPrefix turns a bucket prefix into the form object stores keep: ""
// or without surrounding slashes and ending with "/".
func KeyPrefix(prefix string) string {
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		prefix += "/"
	}
	return prefix
}
