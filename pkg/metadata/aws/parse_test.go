package aws

import (
	"testing"
	"time"
)

const sampleScheduled = `[ {
  "NotBefore" : "21 Jan 2019 09:00:43 GMT",
  "Code" : "system-reboot",
  "Description" : "scheduled reboot",
  "EventId" : "instance-event-0d59937288b749b32",
  "NotAfter" : "21 Jan 2019 09:17:23 GMT",
  "State" : "active"
} ]`

func TestParseScheduledEvents(t *testing.T) {
	evs, err := parseScheduledEvents([]byte(sampleScheduled))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("events=%d, want 1", len(evs))
	}
	e := evs[0]
	if got, want := e.NotBefore, time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC); !got.Equal(want) {
		t.Errorf("NotBefore=%v, want %v", got, want)
	}
	if got, want := e.NotAfter, time.Date(2019, 1, 21, 9, 17, 23, 0, time.UTC); !got.Equal(want) {
		t.Errorf("NotAfter=%v, want %v", got, want)
	}
	if e.EventID != "instance-event-0d59937288b749b32" || e.Code != "system-reboot" || e.State != "active" {
		t.Errorf("event=%+v", e)
	}
	evs, err = parseScheduledEvents([]byte(`[{"EventId":"x","State":"active","NotBefore":"2019-01-21"}]`))
	if err != nil || len(evs) != 1 || !evs[0].NotBefore.IsZero() || evs[0].BadTime != "2019-01-21" {
		t.Errorf("unparseable NotBefore: %+v, %v; want the event with BadTime", evs, err)
	}
	for _, bad := range []string{``, `{}`,
		`[{"EventId":"x","State":"weird","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`,
		`[{"State":"active","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`, `[ {"NotBefore" : "21 Jan`} {
		if _, err := parseScheduledEvents([]byte(bad)); err == nil {
			t.Errorf("ParseScheduledEvents(%q): no error", bad)
		}
	}
	if evs, err := parseScheduledEvents([]byte(`[]`)); err != nil || len(evs) != 0 {
		t.Errorf("empty list: %v, %v", evs, err)
	}
}

func TestParseTime(t *testing.T) {
	for in, want := range map[string]time.Time{
		"21 Jan 2019 09:00:43 GMT": time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC),
		"1 Feb 2024 00:00:00 GMT":  time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC),
		"01 Feb 2024 00:00:00 UTC": time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC),
		"2024-02-01T00:00:00Z":     time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC),
	} {
		got, err := parseTime(in)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q)=%v, %v; want %v", in, got, err, want)
		}
	}
}

func TestParseInstanceAction(t *testing.T) {
	ia, err := parseInstanceAction([]byte(`{"action": "hibernate", "time": "2017-09-18T08:22:00Z"}`))
	if err != nil || ia.Action != "hibernate" || !ia.Time.Equal(time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)) {
		t.Fatalf("ParseInstanceAction=%+v, %v", ia, err)
	}
	ia, err = parseInstanceAction([]byte(`{"action": "stop", "time": "soon"}`))
	if err != nil || ia.Action != "stop" || !ia.Time.IsZero() || ia.BadTime != "soon" {
		t.Fatalf("unparseable time: %+v, %v; want the action with BadTime", ia, err)
	}
	for _, bad := range []string{`{"action": "reboot", "time": "2017-09-18T08:22:00Z"}`, `{"time": "2017-09-18T08:22:00Z"}`, `<html>`} {
		if _, err := parseInstanceAction([]byte(bad)); err == nil {
			t.Errorf("ParseInstanceAction(%q): no error", bad)
		}
	}
}

// FuzzParseScheduledEvents: no input panics, and whatever parses is a
// usable event whose NotBefore survives IMDS's own time format.
func FuzzParseScheduledEvents(f *testing.F) {
	f.Add([]byte(sampleScheduled))
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, err := parseScheduledEvents(body)
		if err != nil {
			return
		}
		for _, e := range evs {
			if e.EventID == "" {
				t.Fatalf("parsed an unusable event %+v", e)
			}
			switch e.State {
			case "active", "completed", "canceled":
			default:
				t.Fatalf("parsed unknown state %q", e.State)
			}
			if y := e.NotBefore.UTC().Year(); y < 1000 || y > 9999 {
				continue
			}
			s := e.NotBefore.UTC().Format("2 Jan 2006 15:04:05 GMT")
			back, err := parseTime(s)
			if err != nil || !back.Equal(e.NotBefore.Truncate(time.Second)) {
				t.Fatalf("ParseTime(%q)=%v, %v; want %v", s, back, err, e.NotBefore)
			}
		}
	})
}
