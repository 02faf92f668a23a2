package azure

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"
)

const sampleDocument = `{
  "DocumentIncarnation": 2,
  "Events": [{
    "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
    "EventStatus": "Scheduled",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["trainer-vm-1"],
    "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
    "Description": "Virtual machine is being evicted.",
    "EventSource": "Platform",
    "DurationInSeconds": -1
  }]
}`

func TestParseDocument(t *testing.T) {
	doc, err := parseDocument([]byte(sampleDocument))
	if err != nil {
		t.Fatal(err)
	}
	want := document{Incarnation: 2, Events: []event{{ID: "C7061BAC-AFDC-4513-B24B-AA5F13A16123", Type: "Preempt",
		ResourceType: "VirtualMachine", Resources: []string{"trainer-vm-1"}, Status: "Scheduled",
		NotBefore: time.Date(2016, 9, 19, 18, 29, 47, 0, time.UTC), Description: "Virtual machine is being evicted.",
		Source: "Platform", DurationInSeconds: -1}}}
	if !reflect.DeepEqual(doc, want) {
		t.Fatalf("doc=%+v\nwant %+v", doc, want)
	}
	empty, err := parseDocument([]byte(`{"DocumentIncarnation": 1, "Events": []}`))
	if err != nil || empty.Incarnation != 1 || len(empty.Events) != 0 {
		t.Fatalf("empty doc=%+v, %v", empty, err)
	}
	for _, bad := range []string{``, `{}`, `{"Events": []}`, `<html></html>`, `{"DocumentIncarnation": 7, "Events": [{"EventId": "5A3B`,
		`{"DocumentIncarnation": 1, "Events": [{"EventType": "Preempt"}]}`} {
		if _, err := parseDocument([]byte(bad)); err == nil {
			t.Errorf("ParseDocument(%q): no error", bad)
		}
	}
	// A NotBefore that does not parse keeps the event: dropping it would
	// drop the eviction.
	doc, err = parseDocument([]byte(`{"DocumentIncarnation": 1, "Events": [{"EventId": "x", "EventType": "Preempt", "NotBefore": "tomorrow"}]}`))
	if err != nil || len(doc.Events) != 1 || !doc.Events[0].NotBefore.IsZero() || doc.Events[0].BadTime != "tomorrow" {
		t.Fatalf("unparseable NotBefore: %+v, %v; want the event with BadTime", doc, err)
	}
}

// FuzzParseDocument: no input panics, and whatever parses survives a round
// trip through the wire format unchanged.
func FuzzParseDocument(f *testing.F) {
	f.Add([]byte(sampleDocument))
	f.Fuzz(func(t *testing.T, body []byte) {
		doc, err := parseDocument(body)
		if err != nil {
			return
		}
		type wire struct {
			EventId, EventType, ResourceType string
			Resources                        []string
			EventStatus, NotBefore           string
			Description, EventSource         string
			DurationInSeconds                int
		}
		w := struct {
			DocumentIncarnation int
			Events              []wire
		}{DocumentIncarnation: doc.Incarnation}
		for _, e := range doc.Events {
			if e.ID == "" || e.Type == "" {
				t.Fatalf("parsed an event without id or type: %+v", e)
			}
			if y := e.NotBefore.Year(); !e.NotBefore.IsZero() && (y < 1000 || y > 9999) {
				return // outside what the wire format can carry back
			}
			nb := ""
			if !e.NotBefore.IsZero() {
				nb = e.NotBefore.UTC().Format(http.TimeFormat)
			}
			if e.BadTime != "" {
				nb = e.BadTime
			}
			w.Events = append(w.Events, wire{e.ID, e.Type, e.ResourceType, e.Resources, e.Status, nb,
				e.Description, e.Source, e.DurationInSeconds})
		}
		again, _ := json.Marshal(w)
		doc2, err := parseDocument(again)
		if err != nil {
			t.Fatalf("re-encoded document does not parse: %v\n%s", err, again)
		}
		for i := range doc.Events {
			doc.Events[i].NotBefore = doc.Events[i].NotBefore.UTC()
		}
		if !reflect.DeepEqual(normalize(doc), normalize(doc2)) {
			t.Fatalf("round trip changed the document:\n%+v\n%+v", doc, doc2)
		}
	})
}

// normalize makes equal documents DeepEqual: empty slices and time zones.
func normalize(d document) document {
	for i := range d.Events {
		d.Events[i].NotBefore = d.Events[i].NotBefore.UTC()
		if len(d.Events[i].Resources) == 0 {
			d.Events[i].Resources = nil
		}
	}
	return d
}
