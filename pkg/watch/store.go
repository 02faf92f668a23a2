package watch

import (
	"context"
	"io"
	"sync"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// VerifyStore is a Store for the committer that runs a check before it
// writes a given manifest: the committer uploads (and hashes) every file,
// then writes the manifest, so a check there sees the files as they were
// after the upload. A failed check fails the commit; nothing of the
// checkpoint is committed and latest.json stays where it was.
type VerifyStore struct {
	cloud.Store
	mu     sync.Mutex
	checks map[string]func() error
}

// NewVerifyStore wraps st.
func NewVerifyStore(st cloud.Store) *VerifyStore {
	return &VerifyStore{Store: st, checks: map[string]func() error{}}
}

// Expect runs check before the manifest of checkpoint (step, id) is
// written; the returned func removes it.
func (s *VerifyStore) Expect(step int64, id string, check func() error) func() {
	key := checkpoint.ManifestKey(step, id)
	s.mu.Lock()
	s.checks[key] = check
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.checks, key)
		s.mu.Unlock()
	}
}

// Put runs the check registered for key, if any, then writes.
func (s *VerifyStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	s.mu.Lock()
	check := s.checks[key]
	s.mu.Unlock()
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	return s.Store.Put(ctx, key, r, size, opts)
}
