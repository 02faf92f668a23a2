package aws

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/internal/poll"
)

// Watch reads spot/instance-action every SpotPollInterval and every notice
// path every PollInterval, and delivers each distinct notice once, until
// ctx ends. While IMDS fails, it waits PollInterval or longer (backoff).
func (s *Source) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	w := &watcher{s: s, out: out, faults: poll.NewFaultLog(s.log, "imds poll")}
	bo := retry.Backoff{Min: s.cfg.PollInterval, Max: s.cfg.MaxBackoff}
	// Every every-th round reads all paths; the others only the spot one.
	every := max(1, int(s.cfg.PollInterval/s.cfg.SpotPollInterval))
	for round := 0; ; round++ {
		all := round%every == 0
		unwell, err := w.poll(ctx, all)
		if ctx.Err() != nil {
			return nil
		}
		wait := s.cfg.SpotPollInterval
		switch {
		case unwell:
			// IMDS did not answer, or answered with an error status:
			// back off, and read every path once it answers again.
			w.faults.Fail(err)
			wait = max(s.cfg.PollInterval, bo.Next())
			round = -1
		case err != nil:
			// A path answered garbage: logged, and the spot path keeps
			// its cadence (a bad scheduled-events document must not slow
			// the detection of a spot notice).
			w.faults.Fail(err)
			bo.Reset()
		default:
			if all { // a spot-only round says nothing of the other paths
				w.faults.OK()
			}
			bo.Reset()
		}
		if retry.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

type watcher struct {
	s      *Source
	out    chan<- metadata.Notice
	faults *poll.FaultLog
	dedup  poll.Dedup
}

// check reads one path and turns a found answer into notices.
type check struct {
	path  string
	parse func(w *watcher, body []byte, now time.Time) ([]metadata.Notice, error)
	spot  bool // read every SpotPollInterval, not only every PollInterval
}

// Spot first: it is the one with a two-minute deadline.
var checks = []check{
	{pathInstanceAction, (*watcher).instanceAction, true},
	{pathLifecycle, (*watcher).lifecycle, false},
	{pathScheduled, (*watcher).scheduled, false},
	{pathRebalance, (*watcher).rebalance, false},
}

// poll reads the spot path, and with all every notice path, once. A path
// that answers badly does not stop the others; a request that got no
// answer at all does (IMDS is down, the next ones would only wait for
// their timeouts too). unwell reports a request that failed over HTTP,
// as against an answer that did not parse.
func (w *watcher) poll(ctx context.Context, all bool) (unwell bool, _ error) {
	var errs []error
	for _, c := range checks {
		if !all && !c.spot {
			continue
		}
		body, found, err := w.s.get(ctx, c.path)
		if err != nil {
			errs = append(errs, err)
			unwell = true
			if httpStatus(err) == 0 {
				break
			}
			continue
		}
		if !found {
			continue
		}
		ns, err := c.parse(w, body, time.Now())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, n := range ns {
			if w.dedup.First(n) && poll.Deliver(ctx, w.out, n) {
				poll.LogNotice(w.s.log, n)
			}
		}
	}
	return unwell, errors.Join(errs...)
}

func (w *watcher) instanceAction(body []byte, now time.Time) ([]metadata.Notice, error) {
	ia, err := parseInstanceAction(body)
	if err != nil {
		return nil, err
	}
	n := metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination,
		ID: poll.HashID("aws-spot", body), Deadline: ia.Time, Detected: now,
		Action: ia.Action, Raw: string(body)}
	if ia.BadTime != "" {
		// The machine goes all the same: assume the usual two minutes
		// from when this agent first saw it.
		if w.dedup.Seen(n.Kind, n.ID) {
			return nil, nil
		}
		n.Deadline = now.Add(SpotNoticeLead)
		w.badTime("spot/instance-action", ia.BadTime, SpotNoticeLead)
	}
	return []metadata.Notice{n}, nil
}

// badTime logs a notice time that did not parse, and the lead assumed.
func (w *watcher) badTime(path, raw string, lead time.Duration) {
	w.s.log.Warn("notice time unparseable: assuming the default lead time",
		zap.String("path", path), zap.String("raw_time", raw), zap.Duration("lead", lead))
}

func (w *watcher) rebalance(body []byte, now time.Time) ([]metadata.Notice, error) {
	if _, err := parseRebalance(body); err != nil {
		return nil, err
	}
	return []metadata.Notice{{Cloud: metadata.CloudAWS, Kind: metadata.KindRebalance,
		ID: poll.HashID("aws-rebalance", body), Detected: now,
		Action: "rebalance-recommendation", Raw: string(body)}}, nil
}

func (w *watcher) lifecycle(body []byte, now time.Time) ([]metadata.Notice, error) {
	state := string(body)
	switch state {
	case "Terminated":
		// Auto Scaling gives no deadline: a lifecycle hook, if any, holds it.
		return []metadata.Notice{{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination,
			ID: "aws-asg-terminated", Detected: now, Action: "asg-terminated", Raw: state}}, nil
	case "InService", "Standby", "Detached", "Warmed:Stopped", "Warmed:Running", "Warmed:Hibernated", "Warmed:Terminated":
		return nil, nil
	}
	return nil, fmt.Errorf("parse target-lifecycle-state: unknown state %.40q", state)
}

// scheduled turns active events into maintenance notices and the
// completion or cancellation of an announced one into a cancelled notice.
func (w *watcher) scheduled(body []byte, now time.Time) ([]metadata.Notice, error) {
	evs, err := parseScheduledEvents(body)
	if err != nil {
		return nil, err
	}
	var ns []metadata.Notice
	for _, ev := range evs {
		n := metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindMaintenance, ID: ev.EventID,
			Deadline: ev.NotBefore, Detected: now, Action: ev.Code, Raw: string(body)}
		if ev.BadTime != "" && ev.State == "active" {
			// AWS announces these days or weeks ahead, with no fixed lead:
			// take the cautious reading, that it may start now.
			if w.dedup.Seen(metadata.KindMaintenance, ev.EventID) {
				continue
			}
			n.Deadline = now
			w.badTime("events/maintenance/scheduled "+ev.EventID, ev.BadTime, 0)
		}
		if ev.State != "active" {
			if !w.dedup.Seen(metadata.KindMaintenance, ev.EventID) {
				continue // never announced: nothing to withdraw
			}
			n.Kind, n.Deadline, n.Action = metadata.KindCancelled, time.Time{}, ev.State
		}
		ns = append(ns, n)
	}
	return ns, nil
}
