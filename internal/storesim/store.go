// Package storesim is an in-memory cloud.Store for deterministic
// simulation of the store protocols (the sim_test.go of pkg/checkpoint/commit
// and of pkg/fleet): every operation passes through a Faults hook that
// may hold it (to interleave sessions), fail it before it happens, or
// fail it after it happened (the reply lost), and lists may lag behind
// writes. Without a
// hook it is an ordinary store and passes the conformance suite
// (pkg/cloud/cloudtest), so the simulation cannot rely on a behaviour the
// real backends lack.
//
// Fleet records (issue 40) are simulated over this same store by
// pkg/fleet's sim_test.go (TestFleetSim): agents recording session ends
// and `spotagent fleet` compactions as actors of one Sched.
package storesim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Kind names a store operation.
type Kind string

// The operations of cloud.Store.
const (
	OpPut    Kind = "put"
	OpGet    Kind = "get"
	OpStat   Kind = "stat"
	OpList   Kind = "list"
	OpDelete Kind = "delete"
)

// Op is one store operation as Faults sees it.
type Op struct {
	Kind Kind
	Key  string // the key; the prefix for OpList
	Opts cloud.PutOptions
	Body []byte // OpPut: what would be written
}

func (o Op) String() string {
	s := string(o.Kind) + " " + o.Key
	if o.Opts.IfAbsent {
		s += " if-absent"
	}
	if o.Opts.IfVersion != "" {
		s += " if-version=" + o.Opts.IfVersion
	}
	return s
}

// Faults decides what becomes of each operation. Before is called before
// the operation touches the store (it may block, to let others run first);
// a non-nil error fails the operation with nothing changed. After is called
// once it ran, with its result, and returns what the caller sees: an error
// there for an operation that succeeded is a lost reply (the write landed).
type Faults interface {
	Before(ctx context.Context, op Op) error
	After(ctx context.Context, op Op, err error) error
}

type object struct {
	data    []byte
	version string
	mod     time.Time
	created int64 // tick of the write that made this version
	deleted int64 // tick of its deletion; 0: live
}

// Store is the in-memory store. Its zero value is not usable: call New.
type Store struct {
	mu   sync.Mutex
	objs map[string]*object // deleted ones stay as tombstones while lists lag
	tick int64              // one per write or delete
	// Faults, when set, sees every operation (set it before use).
	Faults Faults
	// Lag, when > 0, makes List show the store as it was Lag writes ago:
	// newer objects are missing and newer deletions still listed (with
	// the version they had). With Faults set, only the listings of
	// actors (see Sched) lag.
	Lag int64
	// Clock, when set, gives Modified (a simulation's own clock);
	// otherwise time.Now.
	Clock func() time.Time
}

// New returns an empty store.
func New() *Store {
	return &Store{objs: map[string]*object{}}
}

var _ cloud.Store = (*Store)(nil)

func (s *Store) before(ctx context.Context, op Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.Faults != nil {
		return s.Faults.Before(ctx, op)
	}
	return nil
}

func (s *Store) after(ctx context.Context, op Op, err error) error {
	if s.Faults != nil {
		return s.Faults.After(ctx, op, err)
	}
	return err
}

func (s *Store) live(key string) *object {
	if o := s.objs[key]; o != nil && o.deleted == 0 {
		return o
	}
	return nil
}

// Put stores the whole of r atomically; see cloud.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	if err := cloud.ValidKey(key); err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, cloud.ContextReader(ctx, r)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if size >= 0 && int64(buf.Len()) != size {
		return fmt.Errorf("put %s: read %d bytes, size says %d", key, buf.Len(), size)
	}
	op := Op{Kind: OpPut, Key: key, Opts: opts, Body: buf.Bytes()}
	if err := s.before(ctx, op); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return s.after(ctx, op, s.put(key, buf.Bytes(), opts))
}

func (s *Store) put(key string, data []byte, opts cloud.PutOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.live(key)
	switch {
	case opts.IfAbsent && cur != nil:
		return fmt.Errorf("put %s: exists: %w", key, cloud.ErrPrecondition)
	case opts.IfVersion != "" && (cur == nil || cur.version != opts.IfVersion):
		return fmt.Errorf("put %s: version changed: %w", key, cloud.ErrPrecondition)
	}
	s.tick++
	s.objs[key] = &object{data: slices.Clone(data), version: "v" + strconv.FormatInt(s.tick, 10), mod: s.now(), created: s.tick}
	return nil
}

func (s *Store) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}

// Get returns a copy of the range asked for; see cloud.Store.
func (s *Store) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	op := Op{Kind: OpGet, Key: key}
	if err := s.before(ctx, op); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	s.mu.Lock()
	var data []byte
	var err error
	if o := s.live(key); o == nil {
		err = fmt.Errorf("get %s: %w", key, cloud.ErrNotExist)
	} else {
		data = o.data[min(max(offset, 0), int64(len(o.data))):]
		if length >= 0 && length < int64(len(data)) {
			data = data[:length]
		}
		data = slices.Clone(data)
	}
	s.mu.Unlock()
	if err = s.after(ctx, op, err); err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// Stat describes the object at key; see cloud.Store.
func (s *Store) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	op := Op{Kind: OpStat, Key: key}
	if err := s.before(ctx, op); err != nil {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	s.mu.Lock()
	var oi cloud.ObjectInfo
	var err error
	if o := s.live(key); o == nil {
		err = fmt.Errorf("stat %s: %w", key, cloud.ErrNotExist)
	} else {
		oi = info(key, o)
	}
	s.mu.Unlock()
	if err = s.after(ctx, op, err); err != nil {
		return cloud.ObjectInfo{}, err
	}
	return oi, nil
}

func info(key string, o *object) cloud.ObjectInfo {
	return cloud.ObjectInfo{Key: key, Size: int64(len(o.data)), Modified: o.mod, Version: o.version}
}

// List calls fn in key order for the objects under prefix, as the store
// was Lag writes ago; see cloud.Store.
func (s *Store) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	op := Op{Kind: OpList, Key: prefix}
	if err := s.before(ctx, op); err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	s.mu.Lock()
	cut := s.tick
	if s.Faults == nil || ActorOf(ctx) != nil {
		cut -= max(s.Lag, 0) // an oracle's listing (no actor) sees all
	}
	var out []cloud.ObjectInfo
	for k, o := range s.objs {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		// Seen: written by the cut and not yet deleted then. A key
		// rewritten after the cut is missing until the lag passes (a
		// simplification: the objects the protocol lists are written once).
		if o.created <= cut && (o.deleted == 0 || o.deleted > cut) {
			out = append(out, info(k, o))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b cloud.ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	if err := s.after(ctx, op, nil); err != nil {
		return err
	}
	for _, oi := range out {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(oi); err != nil {
			return err
		}
	}
	return nil
}

// Delete removes key (a tombstone while lists lag); see cloud.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	op := Op{Kind: OpDelete, Key: key}
	if err := s.before(ctx, op); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	s.mu.Lock()
	if o := s.live(key); o != nil {
		s.tick++
		o.deleted = s.tick
		if s.Lag <= 0 {
			delete(s.objs, key)
		}
	}
	s.mu.Unlock()
	return s.after(ctx, op, nil)
}

// URI names key: mem://key.
func (s *Store) URI(key string) string { return "mem://" + key }

// Close does nothing.
func (s *Store) Close() error { return nil }

// Object is a stored object as the simulation's checks see it.
type Object struct {
	Key     string
	Data    []byte // shared: do not modify
	Version string
	Created int64 // the tick of its write
}

// Snapshot returns every live object, in key order, without passing
// through Faults: what the checks of the simulation read.
func (s *Store) Snapshot() []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Object
	for k, o := range s.objs {
		if o.deleted == 0 {
			out = append(out, Object{Key: k, Data: o.data, Version: o.version, Created: o.created})
		}
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Tick is the number of writes and deletions so far.
func (s *Store) Tick() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tick
}
