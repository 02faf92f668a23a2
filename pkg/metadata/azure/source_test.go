package azure_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/azure"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/metadata/internal/metatest"
)

const poll = 20 * time.Millisecond

func newSource(f *fake.Azure) *azure.Source {
	return azure.New(azure.Config{Endpoint: f.URL(), PollInterval: poll, RequestTimeout: 300 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond}, nil)
}

func TestIdentity(t *testing.T) {
	f := fake.NewAzure(fake.AzureOptions{VMName: "vm-a", VMID: "id-1", VMSize: "Standard_ND96asr_v4", Location: "westeurope", Zone: "2", Priority: "Spot"})
	defer f.Close()
	id, err := newSource(f).Identity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := metadata.Identity{Cloud: "azure", InstanceID: "id-1", InstanceType: "Standard_ND96asr_v4", Zone: "westeurope-2", Lifecycle: "spot", Name: "vm-a"}
	if id != want {
		t.Fatalf("identity=%+v, want %+v", id, want)
	}
}

func TestEndpointFromEnvironment(t *testing.T) {
	f := fake.NewAzure(fake.AzureOptions{})
	defer f.Close()
	t.Setenv("SPOTAGENT_AZURE_METADATA_ENDPOINT", f.URL())
	if err := azure.New(azure.Config{}, nil).Probe(context.Background()); err != nil {
		t.Fatalf("probe with SPOTAGENT_AZURE_METADATA_ENDPOINT: %v", err)
	}
}

func TestWatch(t *testing.T) {
	t.Run("PreemptThenAck", func(t *testing.T) {
		f := fake.NewAzure(fake.AzureOptions{})
		defer f.Close()
		src := newSource(f)
		ch, _ := metatest.Watch(t, src)
		ev, _ := f.Preempt()
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.ID != ev.EventId || n.Action != "Preempt" || !n.Deadline.Equal(ev.NotBefore) {
			t.Fatalf("notice=%+v, want termination %s at %v", n, ev.EventId, ev.NotBefore)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := src.Ack(ctx, n.ID); err != nil {
			t.Fatal(err)
		}
		if err := f.WaitAck(ctx, ev.EventId); err != nil {
			t.Fatal(err)
		}
		if got := f.Acks(); len(got) != 1 || got[0] != ev.EventId {
			t.Fatalf("acks=%v, want [%s]", got, ev.EventId)
		}
		// The event is now Started (a new incarnation): not a new notice.
		metatest.WaitRequests(t, f, 3)
		metatest.NoNotice(t, ch)
	})
	t.Run("BlankNotBeforeGetsDefaultGrace", func(t *testing.T) {
		f := fake.NewAzure(fake.AzureOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		f.AddEvent(fake.AzureEvent{EventType: "Terminate", EventStatus: "Started"})
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination {
			t.Fatalf("notice=%+v, want termination", n)
		}
		metatest.Within(t, "deadline", n.Deadline, n.Detected.Add(30*time.Second), time.Millisecond)
	})
	t.Run("UnparseableNotBefore", func(t *testing.T) {
		// Read as a blank NotBefore: a Preempt gets the default grace from
		// when it was seen, a Reboot may start at once.
		f := fake.NewAzure(fake.AzureOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		f.AddEvent(fake.AzureEvent{EventType: "Preempt", NotBeforeRaw: "Mon, 32 Foo 2026 25:61:00 XYZ"})
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.Action != "Preempt" {
			t.Fatalf("notice=%+v, want termination/Preempt", n)
		}
		metatest.Within(t, "deadline", n.Deadline, n.Detected.Add(30*time.Second), time.Millisecond)
		f.AddEvent(fake.AzureEvent{EventType: "Reboot", NotBeforeRaw: "soon"})
		n = metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindMaintenance || n.Action != "Reboot" {
			t.Fatalf("notice=%+v, want maintenance/Reboot", n)
		}
		metatest.Within(t, "deadline", n.Deadline, n.Detected, time.Millisecond)
	})
	t.Run("OtherVMIgnored", func(t *testing.T) {
		f := fake.NewAzure(fake.AzureOptions{VMName: "mine"})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		f.AddEvent(fake.AzureEvent{EventType: "Preempt", Resources: []string{"someone-else"}, NotBefore: time.Now().Add(time.Minute)})
		metatest.WaitRequests(t, f, 4)
		metatest.NoNotice(t, ch)
		f.AddEvent(fake.AzureEvent{EventType: "Preempt", Resources: []string{"someone-else", "MINE"}, NotBefore: time.Now().Add(time.Minute)})
		if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
			t.Fatalf("notice=%+v, want termination", n)
		}
	})
	t.Run("MaintenanceThenCancelled", func(t *testing.T) {
		for _, typ := range []string{"Reboot", "Redeploy", "Freeze"} {
			f := fake.NewAzure(fake.AzureOptions{})
			defer f.Close()
			ch, stop := metatest.Watch(t, newSource(f))
			nb := time.Now().Add(10 * time.Minute).Truncate(time.Second)
			ev, _ := f.AddEvent(fake.AzureEvent{EventType: typ, NotBefore: nb, DurationInSeconds: 10})
			n := metatest.Next(t, ch, 10*time.Second)
			if n.Kind != metadata.KindMaintenance || n.Action != typ || !n.Deadline.Equal(nb) {
				t.Fatalf("notice=%+v, want maintenance/%s at %v", n, typ, nb)
			}
			f.RemoveEvent(ev.EventId)
			c := metatest.Next(t, ch, 10*time.Second)
			if c.Kind != metadata.KindCancelled || c.ID != ev.EventId {
				t.Fatalf("notice=%+v, want cancelled %s", c, ev.EventId)
			}
			stop()
		}
	})
	t.Run("StopsPromptlyWhileRequestHangs", func(t *testing.T) {
		f := fake.NewAzure(fake.AzureOptions{})
		defer f.Close()
		f.SetFault(fake.FaultHang)
		_, stop := metatest.Watch(t, azure.New(azure.Config{Endpoint: f.URL(), RequestTimeout: time.Minute}, nil))
		metatest.WaitTotal(t, f, 1) // the one request, hanging
		stop()
	})
}

// TestWatch_Faults: every fault is survived without a notice, and an
// eviction after the fault heals is delivered. The fault starts once the
// VM name is known, so the Scheduled Events polls are what fails.
func TestWatch_Faults(t *testing.T) {
	for _, fault := range fake.Faults {
		t.Run(fault.String(), func(t *testing.T) {
			f := fake.NewAzure(fake.AzureOptions{})
			defer f.Close()
			ch, _ := metatest.Watch(t, newSource(f))
			metatest.WaitRequests(t, f, 2)
			f.SetFault(fault)
			metatest.WaitRequests(t, f, 6)
			metatest.NoNotice(t, ch)
			f.SetFault(fake.FaultNone)
			f.Preempt()
			if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
				t.Fatalf("notice=%+v, want termination", n)
			}
		})
	}
}

func TestWatch_FaultBeforeName(t *testing.T) {
	f := fake.NewAzure(fake.AzureOptions{})
	defer f.Close()
	f.SetFault(fake.FaultGarbage)
	ch, _ := metatest.Watch(t, newSource(f))
	metatest.WaitRequests(t, f, 4)
	f.SetFault(fake.FaultNone)
	f.Preempt()
	if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
		t.Fatalf("notice=%+v, want termination", n)
	}
}

// TestAck_RetriedUntilIMDSAnswers: an approval that fails (IMDS 503) is
// sent again until it lands, within the caller's context.
func TestAck_RetriedUntilIMDSAnswers(t *testing.T) {
	f := fake.NewAzure(fake.AzureOptions{})
	defer f.Close()
	f.SetFault(fake.Fault5xx)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- newSource(f).Ack(ctx, "x") }()
	// Each attempt is 3 requests (retryablehttp's own 2 retries): 6 is a
	// second attempt after the first failed.
	metatest.WaitRequests(t, f, 6)
	f.SetFault(fake.FaultNone)
	if err := <-done; err != nil {
		t.Fatalf("ack once IMDS answers: %v", err)
	}
	if got := f.Acks(); len(got) != 1 || got[0] != "x" {
		t.Fatalf("acks %v, want [x]", got)
	}
}

// TestAck_Fails: an IMDS that never answers ends the ack with its context;
// a refusal (418) ends it at once, not asked again.
func TestAck_Fails(t *testing.T) {
	for _, c := range []struct {
		fault   fake.Fault
		maxReqs int64 // requests at most
	}{{fake.Fault5xx, 1 << 20}, {fake.FaultStatus, 1}} {
		t.Run(c.fault.String(), func(t *testing.T) {
			f := fake.NewAzure(fake.AzureOptions{})
			defer f.Close()
			f.SetFault(c.fault)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			err := newSource(f).Ack(ctx, "x")
			// Its context's 2 s, and one request's timeout (300 ms) at most
			// past it: slack for a loaded machine.
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("ack took %s with a 2 s context", took)
			}
			if err == nil || !strings.Contains(err.Error(), "attempts") {
				t.Fatalf("ack against a failing IMDS: %v, want an error that says how many attempts", err)
			}
			if n := f.Requests(); n > c.maxReqs {
				t.Fatalf("%d requests, want at most %d", n, c.maxReqs)
			}
			if c.fault == fake.Fault5xx && !strings.Contains(err.Error(), "status 503") {
				t.Fatalf("ack error %q, want the last answer (503)", err)
			}
		})
	}
}
