package gcp

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/internal/poll"
)

// Watch holds one hanging GET open on instance/preempted and one on
// instance/maintenance-event (read once at start: GCE only sends the
// maintenance warning to a VM that has read the key), until ctx ends.
func (s *Source) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	var wg sync.WaitGroup
	for _, k := range []*keyWatch{
		{key: keyPreempted, interpret: s.preempted},
		{key: keyMaintenance, interpret: s.maintenance},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watchKey(ctx, k, out)
		}()
	}
	wg.Wait()
	return nil
}

// keyWatch is the state of one watched key.
type keyWatch struct {
	key       string
	interpret func(k *keyWatch, value, etag string, now time.Time) (*metadata.Notice, error)
	last      string // last valid value, "" before the first
	lastID    string // ID of the last notice delivered for this key
	dedup     poll.Dedup
}

func (s *Source) watchKey(ctx context.Context, k *keyWatch, out chan<- metadata.Notice) {
	faults := poll.NewFaultLog(s.log.With(zap.String("key", k.key)), "metadata watch")
	bo := retry.Backoff{Min: 50 * time.Millisecond, Max: s.cfg.MaxBackoff}
	etag := ""
	for {
		value, newETag, err := s.fetch(ctx, k.key, etag)
		if ctx.Err() != nil {
			return
		}
		var n *metadata.Notice
		if err == nil && newETag == "" {
			err = errNoETag // without one the next GET would not hang: a busy loop
		}
		if err == nil {
			n, err = k.interpret(k, value, newETag, time.Now())
		}
		if err != nil {
			faults.Fail(err)
			if retry.Sleep(ctx, bo.Next()) != nil {
				return
			}
			continue
		}
		faults.OK()
		bo.Reset()
		etag, k.last = newETag, value
		if n != nil && k.dedup.First(*n) && poll.Deliver(ctx, out, *n) {
			k.lastID = n.ID
			poll.LogNotice(s.log, *n)
		}
	}
}

// preempted: FALSE → TRUE is a termination.
func (s *Source) preempted(k *keyWatch, value, etag string, now time.Time) (*metadata.Notice, error) {
	switch value {
	case "FALSE":
		return nil, nil
	case "TRUE":
		if k.last == "TRUE" {
			return nil, nil
		}
		return &metadata.Notice{Cloud: metadata.CloudGCP, Kind: metadata.KindTermination,
			ID: "gcp-preempted-" + etag, Deadline: now.Add(s.cfg.PreemptGrace), Detected: now,
			Action: "preempted", Raw: value}, nil
	}
	return nil, fmt.Errorf("%s: unexpected value %.40q", keyPreempted, value)
}

// maintenance: a change to TERMINATE/SHUTDOWN is a termination, to MIGRATE
// a maintenance, back to NONE the cancellation of the last notice.
func (s *Source) maintenance(k *keyWatch, value, etag string, now time.Time) (*metadata.Notice, error) {
	n := &metadata.Notice{Cloud: metadata.CloudGCP, ID: "gcp-maintenance-" + etag, Detected: now,
		Deadline: now.Add(s.cfg.MaintenanceGrace), Action: value, Raw: value}
	switch value {
	case maintenanceTerminate, maintenanceShutdown:
		n.Kind = metadata.KindTermination
	case maintenanceMigrate:
		n.Kind = metadata.KindMaintenance
	case maintenanceNone:
		if k.lastID == "" || k.last == maintenanceNone {
			return nil, nil
		}
		n.Kind, n.ID, n.Deadline = metadata.KindCancelled, k.lastID, time.Time{}
		return n, nil
	default:
		return nil, fmt.Errorf("%s: unexpected value %.40q", keyMaintenance, value)
	}
	if value == k.last {
		return nil, nil
	}
	return n, nil
}
