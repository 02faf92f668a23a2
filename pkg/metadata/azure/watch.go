package azure

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/internal/poll"
)

// Watch reads this VM's name once, then polls Scheduled Events every
// PollInterval until ctx ends. Events for other resources are ignored; an
// event that disappears after its notice is delivered as cancelled.
func (s *Source) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	name, ok := s.vmName(ctx)
	if !ok {
		return nil
	}
	w := &watcher{s: s, name: name, out: out, incarnation: -1, active: make(map[string]bool)}
	faults := poll.NewFaultLog(s.log, "scheduled events poll")
	bo := retry.Backoff{Min: s.cfg.PollInterval, Max: s.cfg.MaxBackoff}
	for {
		body, err := s.do(ctx, "GET", pathScheduledEvents, nil)
		if ctx.Err() != nil {
			return nil
		}
		var doc document
		if err == nil {
			doc, err = parseDocument(body)
		}
		wait := s.cfg.PollInterval
		if err != nil {
			faults.Fail(err)
			wait = max(wait, bo.Next())
		} else {
			faults.OK()
			bo.Reset()
			w.update(ctx, doc, string(body), time.Now())
		}
		if retry.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// vmName reads compute.name, retrying with backoff; false when ctx ended.
func (s *Source) vmName(ctx context.Context) (string, bool) {
	faults := poll.NewFaultLog(s.log, "instance metadata")
	bo := retry.Backoff{Min: s.cfg.PollInterval, Max: s.cfg.MaxBackoff}
	for {
		in, err := s.instance(ctx)
		if ctx.Err() != nil {
			return "", false
		}
		if err == nil {
			faults.OK()
			return in.Compute.Name, true
		}
		faults.Fail(err)
		if retry.Sleep(ctx, bo.Next()) != nil {
			return "", false
		}
	}
}

type watcher struct {
	s           *Source
	name        string
	out         chan<- metadata.Notice
	incarnation int
	active      map[string]bool // IDs delivered and still listed
	dedup       poll.Dedup
}

// update delivers the notices of a new document incarnation.
func (w *watcher) update(ctx context.Context, doc document, raw string, now time.Time) {
	if doc.Incarnation == w.incarnation {
		return
	}
	listed := make(map[string]bool)
	var ns []metadata.Notice
	for _, ev := range doc.Events {
		if !slices.ContainsFunc(ev.Resources, func(r string) bool { return strings.EqualFold(r, w.name) }) {
			continue
		}
		listed[ev.ID] = true
		ns = append(ns, w.notice(ev, raw, now))
	}
	for id := range w.active {
		if !listed[id] {
			ns = append(ns, metadata.Notice{Cloud: metadata.CloudAzure, Kind: metadata.KindCancelled,
				ID: id, Detected: now, Raw: raw})
		}
	}
	for _, n := range ns {
		if !w.dedup.First(n) {
			continue
		}
		if !poll.Deliver(ctx, w.out, n) {
			return // incarnation not recorded: nothing is lost
		}
		if n.Kind == metadata.KindCancelled {
			delete(w.active, n.ID)
		} else {
			w.active[n.ID] = true
		}
		poll.LogNotice(w.s.log, n)
	}
	w.incarnation = doc.Incarnation
}

func (w *watcher) notice(ev event, raw string, now time.Time) metadata.Notice {
	n := metadata.Notice{Cloud: metadata.CloudAzure, Kind: metadata.KindMaintenance, ID: ev.ID,
		Deadline: ev.NotBefore, Detected: now, Action: ev.Type, Raw: raw}
	if ev.BadTime != "" && !w.dedup.Seen(metadata.KindTermination, ev.ID) && !w.dedup.Seen(metadata.KindMaintenance, ev.ID) {
		// Read as a blank NotBefore: a termination gets DefaultGrace, any
		// other event may start at once.
		w.s.log.Warn("notice time unparseable: assuming the default lead time", zap.String("event", ev.ID),
			zap.String("type", ev.Type), zap.String("raw_time", ev.BadTime), zap.Duration("termination_lead", w.s.cfg.DefaultGrace))
	}
	switch ev.Type {
	case "Preempt", "Terminate":
		n.Kind = metadata.KindTermination
		if n.Deadline.IsZero() || ev.Status == "Started" {
			n.Deadline = now.Add(w.s.cfg.DefaultGrace)
		}
	default: // Reboot, Redeploy, Freeze, and any type Azure adds later
		if n.Deadline.IsZero() {
			n.Deadline = now
		}
	}
	return n
}
