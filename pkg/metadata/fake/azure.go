package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// azureTimeLayout is how Scheduled Events write NotBefore.
const azureTimeLayout = http.TimeFormat // Mon, 02 Jan 2006 15:04:05 GMT

// AzureOptions configures a fake Azure IMDS. Zero fields take the defaults shown.
type AzureOptions struct {
	VMName   string // trainer-vm-1
	VMID     string // 02aab8a4-74ef-476e-8182-f6d2ba4166a6
	VMSize   string // Standard_NC6s_v3
	Location string // eastus
	Zone     string // 1
	Priority string // Spot
}

// AzureEvent is one entry of the Scheduled Events document.
type AzureEvent struct {
	EventId           string
	EventType         string // Preempt, Terminate, Reboot, Redeploy, Freeze
	ResourceType      string // VirtualMachine
	Resources         []string
	EventStatus       string    // Scheduled, Started
	NotBefore         time.Time // zero: written as ""
	Description       string
	EventSource       string // Platform, User
	DurationInSeconds int    // -1 when unknown
	NotBeforeRaw      string // when set, written instead of NotBefore
}

// Azure is a fake Azure instance metadata service with Scheduled Events.
type Azure struct {
	base
	opts AzureOptions

	mu          sync.Mutex
	incarnation int
	events      []AzureEvent
	acks        []string
	acked       chan struct{} // closed and replaced on every ack
	seq         int
}

var _ Server = (*Azure)(nil)

// NewAzure starts a fake Azure IMDS on a free loopback port. It panics if
// it cannot listen, like httptest.NewServer.
func NewAzure(opts AzureOptions) *Azure {
	z, err := StartAzure("127.0.0.1:0", opts)
	if err != nil {
		panic("fake: " + err.Error())
	}
	return z
}

// StartAzure starts a fake Azure IMDS on addr.
func StartAzure(addr string, opts AzureOptions) (*Azure, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&opts.VMName, "trainer-vm-1")
	def(&opts.VMID, "02aab8a4-74ef-476e-8182-f6d2ba4166a6")
	def(&opts.VMSize, "Standard_NC6s_v3")
	def(&opts.Location, "eastus")
	def(&opts.Zone, "1")
	def(&opts.Priority, "Spot")
	z := &Azure{opts: opts, incarnation: 1, acked: make(chan struct{})}
	if err := z.start(addr, http.HandlerFunc(z.serve)); err != nil {
		return nil, err
	}
	return z, nil
}

// Env returns SPOTAGENT_AZURE_METADATA_ENDPOINT and the fake's URL.
func (z *Azure) Env() (string, string) { return "SPOTAGENT_AZURE_METADATA_ENDPOINT", z.URL() }

// AddEvent adds ev, or replaces the event with the same EventId, bumps the
// DocumentIncarnation and returns when it was exposed. Empty fields take
// ResourceType VirtualMachine, Resources [VMName], EventStatus Scheduled,
// EventSource Platform, DurationInSeconds -1; an empty EventId gets one.
func (z *Azure) AddEvent(ev AzureEvent) (AzureEvent, time.Time) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if ev.EventId == "" {
		z.seq++
		ev.EventId = fmt.Sprintf("A123BC45-1234-5678-AB90-%012d", z.seq)
	}
	if ev.ResourceType == "" {
		ev.ResourceType = "VirtualMachine"
	}
	if ev.Resources == nil {
		ev.Resources = []string{z.opts.VMName}
	}
	if ev.EventStatus == "" {
		ev.EventStatus = "Scheduled"
	}
	if ev.EventSource == "" {
		ev.EventSource = "Platform"
	}
	if ev.DurationInSeconds == 0 {
		ev.DurationInSeconds = -1
	}
	if i := z.index(ev.EventId); i >= 0 {
		z.events[i] = ev
	} else {
		z.events = append(z.events, ev)
	}
	z.incarnation++
	return ev, z.expose()
}

// Preempt schedules a Spot eviction of this VM 30 s ahead and returns the
// event and when it was exposed.
func (z *Azure) Preempt() (AzureEvent, time.Time) {
	return z.AddEvent(AzureEvent{EventType: "Preempt", NotBefore: time.Now().Add(30 * time.Second).Truncate(time.Second),
		Description: "Virtual machine is being evicted."})
}

// RemoveEvent withdraws event id, bumps the DocumentIncarnation and returns
// when the removal was exposed (zero if there is no such event).
func (z *Azure) RemoveEvent(id string) time.Time {
	z.mu.Lock()
	defer z.mu.Unlock()
	i := z.index(id)
	if i < 0 {
		return time.Time{}
	}
	z.events = slices.Delete(z.events, i, i+1)
	z.incarnation++
	return z.expose()
}

// Notice schedules a Spot eviction 30 s ahead.
func (z *Azure) Notice() time.Time {
	_, t := z.Preempt()
	return t
}

// NoticeAfter schedules a Spot eviction after d.
func (z *Azure) NoticeAfter(d time.Duration) func() bool {
	return time.AfterFunc(d, func() { z.Preempt() }).Stop
}

// Acks returns the EventIds acknowledged so far, in order.
func (z *Azure) Acks() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.acks)
}

// WaitAck waits until event id is acknowledged or ctx ends.
func (z *Azure) WaitAck(ctx context.Context, id string) error {
	for {
		z.mu.Lock()
		done, ch := slices.Contains(z.acks, id), z.acked
		z.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait ack %s: %w", id, ctx.Err())
		}
	}
}

func (z *Azure) index(id string) int {
	return slices.IndexFunc(z.events, func(e AzureEvent) bool { return e.EventId == id })
}

func (z *Azure) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	if r.Header.Get("X-Forwarded-For") != "" {
		azureError(w, http.StatusForbidden, "Forbidden")
		return
	}
	if r.Header.Get("Metadata") != "true" {
		azureError(w, http.StatusBadRequest, "Bad request. Required metadata header not specified")
		return
	}
	if r.URL.Query().Get("api-version") == "" {
		azureError(w, http.StatusBadRequest, "Bad request. api-version was not specified in the request. For more information refer to aka.ms/azureimds")
		return
	}
	switch {
	case r.URL.Path == "/metadata/instance" && r.Method == http.MethodGet:
		z.serveInstance(w)
	case r.URL.Path == "/metadata/scheduledevents" && r.Method == http.MethodGet:
		z.serveEvents(w)
	case r.URL.Path == "/metadata/scheduledevents" && r.Method == http.MethodPost:
		z.serveAck(w, r)
	default:
		azureError(w, http.StatusNotFound, "Not found")
	}
}

func azureError(w http.ResponseWriter, code int, msg string) {
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (z *Azure) serveInstance(w http.ResponseWriter) {
	o := z.opts
	_ = json.NewEncoder(w).Encode(map[string]any{
		"compute": map[string]any{
			"azEnvironment": "AzurePublicCloud", "location": o.Location, "name": o.VMName,
			"osType": "Linux", "priority": o.Priority, "vmId": o.VMID, "vmSize": o.VMSize, "zone": o.Zone,
		},
		"network": map[string]any{"interface": []any{}},
	})
}

func (z *Azure) serveEvents(w http.ResponseWriter) {
	type wire struct {
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
	z.mu.Lock()
	doc := struct {
		DocumentIncarnation int
		Events              []wire
	}{DocumentIncarnation: z.incarnation, Events: []wire{}}
	for _, e := range z.events {
		nb := ""
		if !e.NotBefore.IsZero() {
			nb = e.NotBefore.UTC().Format(azureTimeLayout)
		}
		if e.NotBeforeRaw != "" {
			nb = e.NotBeforeRaw
		}
		doc.Events = append(doc.Events, wire{e.EventId, e.EventType, e.ResourceType, e.Resources,
			e.EventStatus, nb, e.Description, e.EventSource, e.DurationInSeconds})
	}
	z.mu.Unlock()
	_ = json.NewEncoder(w).Encode(doc)
}

func (z *Azure) serveAck(w http.ResponseWriter, r *http.Request) {
	var req struct {
		StartRequests []struct{ EventId string }
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil || len(req.StartRequests) == 0 {
		azureError(w, http.StatusBadRequest, "Bad request. Invalid StartRequests body")
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, s := range req.StartRequests {
		if i := z.index(s.EventId); i >= 0 {
			// Azure starts an approved event at once.
			z.events[i].EventStatus = "Started"
			z.incarnation++
		}
		z.acks = append(z.acks, s.EventId)
	}
	close(z.acked)
	z.acked = make(chan struct{})
	w.WriteHeader(http.StatusOK)
}
