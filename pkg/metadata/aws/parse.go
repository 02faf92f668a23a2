package aws

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SpotNoticeLead is how long ahead of the action AWS announces a spot
// interruption: the deadline taken when the notice's time does not parse.
const SpotNoticeLead = 2 * time.Minute

// instanceAction is the body of spot/instance-action.
type instanceAction struct {
	Action string    // terminate, stop, hibernate
	Time   time.Time // when the action happens; zero when BadTime is set
	// BadTime is the time as IMDS wrote it when it did not parse: the
	// action still stands (the machine goes), only its deadline is unknown.
	BadTime string
}

// parseInstanceAction parses spot/instance-action. A known action whose time
// does not parse is returned with BadTime set, not as an error: dropping it
// would drop the interruption.
func parseInstanceAction(body []byte) (instanceAction, error) {
	var w struct {
		Action string `json:"action"`
		Time   string `json:"time"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return instanceAction{}, fmt.Errorf("parse instance-action: %w", err)
	}
	switch w.Action {
	case "terminate", "stop", "hibernate":
	default:
		return instanceAction{}, fmt.Errorf("parse instance-action: unknown action %q", w.Action)
	}
	t, err := time.Parse(time.RFC3339, w.Time)
	if err != nil {
		return instanceAction{Action: w.Action, BadTime: w.Time}, nil
	}
	return instanceAction{Action: w.Action, Time: t}, nil
}

// parseRebalance parses events/recommendations/rebalance and returns its
// noticeTime; zero when the time does not parse (the recommendation stands:
// it carries no deadline).
func parseRebalance(body []byte) (time.Time, error) {
	var w struct {
		NoticeTime *string `json:"noticeTime"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return time.Time{}, fmt.Errorf("parse rebalance: %w", err)
	}
	if w.NoticeTime == nil {
		return time.Time{}, errors.New("parse rebalance: no noticeTime")
	}
	t, err := time.Parse(time.RFC3339, *w.NoticeTime)
	if err != nil {
		return time.Time{}, nil
	}
	return t, nil
}

// scheduledEvent is one entry of events/maintenance/scheduled.
type scheduledEvent struct {
	EventID     string
	Code        string // system-reboot, system-maintenance, instance-reboot, instance-stop, instance-retirement
	Description string
	State       string    // active, completed, canceled
	NotBefore   time.Time // zero when BadTime is set
	NotAfter    time.Time // zero when absent or unparseable
	BadTime     string    // NotBefore as IMDS wrote it, when it did not parse
}

// parseScheduledEvents parses events/maintenance/scheduled. Every event must
// have an EventId and a known State; one bad event fails the whole
// document, so that a half-read answer never yields a notice. A NotBefore
// that does not parse does not drop the event: BadTime keeps it.
func parseScheduledEvents(body []byte) ([]scheduledEvent, error) {
	var ws []struct {
		NotBefore   string `json:"NotBefore"`
		NotAfter    string `json:"NotAfter"`
		Code        string `json:"Code"`
		Description string `json:"Description"`
		EventID     string `json:"EventId"`
		State       string `json:"State"`
	}
	if err := json.Unmarshal(body, &ws); err != nil {
		return nil, fmt.Errorf("parse scheduled events: %w", err)
	}
	evs := make([]scheduledEvent, 0, len(ws))
	for _, w := range ws {
		if w.EventID == "" {
			return nil, errors.New("parse scheduled events: event without EventId")
		}
		switch w.State {
		case "active", "completed", "canceled":
		default:
			return nil, fmt.Errorf("parse scheduled events: %s: unknown state %q", w.EventID, w.State)
		}
		ev := scheduledEvent{EventID: w.EventID, Code: w.Code, Description: w.Description, State: w.State}
		nb, err := parseTime(w.NotBefore)
		if err != nil {
			ev.BadTime = w.NotBefore
		} else {
			ev.NotBefore = nb
		}
		if w.NotAfter != "" {
			if ev.NotAfter, err = parseTime(w.NotAfter); err != nil {
				ev.NotAfter = time.Time{}
			}
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// parseTime parses the times of scheduled events, "21 Jan 2019 09:00:43 GMT"
// (not RFC 3339). RFC 3339 is accepted too.
func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, zone := range []string{" GMT", " UTC"} {
		if rest, ok := strings.CutSuffix(s, zone); ok {
			t, err := time.ParseInLocation("2 Jan 2006 15:04:05", rest, time.UTC)
			if err != nil {
				return time.Time{}, fmt.Errorf("parse time %q: %w", s, err)
			}
			return t, nil
		}
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse time %q: %w", s, err)
	}
	return t, nil
}
