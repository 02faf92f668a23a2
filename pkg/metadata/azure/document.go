package azure

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// document is the Scheduled Events document.
type document struct {
	Incarnation int
	Events      []event
}

// event is one scheduled event.
type event struct {
	ID                string // EventId
	Type              string // Preempt, Terminate, Reboot, Redeploy, Freeze
	ResourceType      string // VirtualMachine
	Resources         []string
	Status            string    // Scheduled, Started
	NotBefore         time.Time // zero when blank (the event has started) or unparseable
	BadTime           string    // NotBefore as Azure wrote it, when it did not parse
	Description       string
	Source            string // Platform, User
	DurationInSeconds int
}

// parseDocument parses a Scheduled Events document. DocumentIncarnation
// is required, and every event needs an EventId and an EventType; a bad
// event fails the whole document, so that a half-read answer never yields
// a notice (nor, by omission, a cancellation). A NotBefore that does not
// parse keeps its event, with BadTime set and NotBefore zero.
func parseDocument(body []byte) (document, error) {
	var w struct {
		DocumentIncarnation *int
		Events              []struct {
			EventId           string
			EventType         string
			ResourceType      string
			Resources         []string
			EventStatus       string
			NotBefore         string
			Description       string
			EventSource       string
			DurationInSeconds int
		}
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return document{}, fmt.Errorf("parse scheduled events: %w", err)
	}
	if w.DocumentIncarnation == nil {
		return document{}, errors.New("parse scheduled events: no DocumentIncarnation")
	}
	doc := document{Incarnation: *w.DocumentIncarnation, Events: make([]event, 0, len(w.Events))}
	for _, e := range w.Events {
		if e.EventId == "" || e.EventType == "" {
			return document{}, errors.New("parse scheduled events: event without EventId or EventType")
		}
		ev := event{ID: e.EventId, Type: e.EventType, ResourceType: e.ResourceType, Resources: e.Resources,
			Status: e.EventStatus, Description: e.Description, Source: e.EventSource, DurationInSeconds: e.DurationInSeconds}
		if e.NotBefore != "" {
			t, err := http.ParseTime(e.NotBefore) // "Mon, 19 Sep 2016 18:29:47 GMT"
			if err != nil {
				ev.BadTime = e.NotBefore // the event stands; only its time is unknown
			} else {
				ev.NotBefore = t
			}
		}
		doc.Events = append(doc.Events, ev)
	}
	return doc, nil
}
