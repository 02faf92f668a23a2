package wrap

import (
	"context"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

type logged struct {
	cloud.Store
	log *zap.Logger
}

// Log wraps st so that every operation (each attempt, under Retry) is
// logged at debug level with its key, duration and error. Only keys and
// sizes are logged, never a credential.
func Log(st cloud.Store, log *zap.Logger) cloud.Store {
	return &logged{Store: st, log: log}
}

func (l *logged) done(op, key string, start time.Time, err error, fields ...zap.Field) {
	if ce := l.log.Check(zap.DebugLevel, "store "+op); ce != nil {
		ce.Write(append(fields, zap.String("key", key), zap.Duration("took", time.Since(start)), zap.Error(err))...)
	}
}

func (l *logged) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	start := time.Now()
	err := l.Store.Put(ctx, key, r, size, opts)
	l.done("put", key, start, err, zap.Int64("size", size), zap.Bool("if_absent", opts.IfAbsent), zap.String("if_version", opts.IfVersion))
	return err
}

func (l *logged) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := l.Store.Get(ctx, key, offset, length)
	l.done("get", key, start, err, zap.Int64("offset", offset), zap.Int64("length", length))
	return rc, err
}

func (l *logged) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	start := time.Now()
	oi, err := l.Store.Stat(ctx, key)
	l.done("stat", key, start, err)
	return oi, err
}

func (l *logged) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	start, n := time.Now(), 0
	err := l.Store.List(ctx, prefix, func(oi cloud.ObjectInfo) error { n++; return fn(oi) })
	l.done("list", prefix, start, err, zap.Int("objects", n))
	return err
}

func (l *logged) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := l.Store.Delete(ctx, key)
	l.done("delete", key, start, err)
	return err
}

func (l *logged) Cleanup(ctx context.Context, opts ...cloud.CleanupOptions) (int, error) {
	start := time.Now()
	n, err := cleanup(ctx, l.Store, opts)
	l.done("cleanup", "", start, err, zap.Int("removed", n))
	return n, err
}

// Unwrap returns the store Log wrapped.
func (l *logged) Unwrap() cloud.Store { return l.Store }
