package gcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/metadata/gcp"
	"github.com/spotagent/spotagent/pkg/metadata/internal/metatest"
)

func newSource(f *fake.GCP) *gcp.Source {
	return gcp.New(gcp.Config{Host: f.Host(), RequestTimeout: 200 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, nil)
}

func TestIdentity(t *testing.T) {
	f := fake.NewGCP(fake.GCPOptions{InstanceID: "42", Name: "trainer-7", Zone: "projects/1/zones/europe-west4-a",
		MachineType: "projects/1/machineTypes/a2-ultragpu-1g", Preemptible: "TRUE"})
	defer f.Close()
	id, err := newSource(f).Identity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := metadata.Identity{Cloud: "gcp", InstanceID: "42", Name: "trainer-7", Zone: "europe-west4-a",
		InstanceType: "a2-ultragpu-1g", Lifecycle: "preemptible"}
	if id != want {
		t.Fatalf("identity=%+v, want %+v", id, want)
	}
}

func TestHostFromEnvironment(t *testing.T) {
	f := fake.NewGCP(fake.GCPOptions{})
	defer f.Close()
	t.Setenv("GCE_METADATA_HOST", f.Host())
	if err := gcp.New(gcp.Config{}, nil).Probe(context.Background()); err != nil {
		t.Fatalf("probe with GCE_METADATA_HOST: %v", err)
	}
}

func TestWatch(t *testing.T) {
	t.Run("Preempted", func(t *testing.T) {
		f := fake.NewGCP(fake.GCPOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		metatest.WaitTotal(t, f, 4) // both keys read, both hanging GETs open
		f.Preempt()
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.Action != "preempted" || n.Cloud != metadata.CloudGCP {
			t.Fatalf("notice=%+v, want termination/preempted", n)
		}
		metatest.Within(t, "deadline", n.Deadline, n.Detected.Add(30*time.Second), time.Millisecond)
		// Same value, new etag: not a new notice. Count from before the
		// change: the GET it ends is re-issued at once.
		before := f.Requests()
		f.Set("instance/preempted", "TRUE")
		metatest.WaitFor(t, 5*time.Second, "the hanging GET re-issued", func() bool { return f.Requests() > before })
		metatest.NoNotice(t, ch)
	})
	t.Run("MaintenanceReadAtStart", func(t *testing.T) {
		f := fake.NewGCP(fake.GCPOptions{})
		defer f.Close()
		f.Maintenance(fake.GCPMaintenanceMigrate)
		ch, _ := metatest.Watch(t, newSource(f))
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindMaintenance || n.Action != fake.GCPMaintenanceMigrate {
			t.Fatalf("notice=%+v, want maintenance/migrate", n)
		}
		metatest.Within(t, "deadline", n.Deadline, n.Detected.Add(60*time.Second), time.Millisecond)
		f.Maintenance(fake.GCPMaintenanceNone)
		c := metatest.Next(t, ch, 10*time.Second)
		if c.Kind != metadata.KindCancelled || c.ID != n.ID {
			t.Fatalf("notice=%+v, want cancelled with id %s", c, n.ID)
		}
	})
	t.Run("TerminateOnHostMaintenance", func(t *testing.T) {
		for _, v := range []string{fake.GCPMaintenanceTerminate, fake.GCPMaintenanceShutdown} {
			f := fake.NewGCP(fake.GCPOptions{})
			defer f.Close()
			ch, stop := metatest.Watch(t, newSource(f))
			metatest.WaitTotal(t, f, 4)
			f.Maintenance(v)
			n := metatest.Next(t, ch, 10*time.Second)
			if n.Kind != metadata.KindTermination || n.Action != v {
				t.Fatalf("notice=%+v, want termination/%s", n, v)
			}
			metatest.Within(t, "deadline", n.Deadline, n.Detected.Add(60*time.Second), time.Millisecond)
			stop()
		}
	})
	t.Run("StopsPromptlyWhileHanging", func(t *testing.T) {
		f := fake.NewGCP(fake.GCPOptions{})
		defer f.Close()
		_, stop := metatest.Watch(t, gcp.New(gcp.Config{Host: f.Host()}, nil)) // 60 s hanging GETs
		metatest.WaitTotal(t, f, 4)
		stop() // fails unless Watch returns within 5 s, not the 60 s of the GET
	})
}

// TestWatch_Faults: every fault is survived without a notice, and a
// preemption after the fault heals is delivered.
func TestWatch_Faults(t *testing.T) {
	for _, fault := range fake.Faults {
		t.Run(fault.String(), func(t *testing.T) {
			f := fake.NewGCP(fake.GCPOptions{})
			defer f.Close()
			f.SetFault(fault)
			ch, _ := metatest.Watch(t, newSource(f))
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

// TestWatch_FaultDuringHangingGET: the server fails while GETs hang (a
// 503 during maintenance, a dropped connection); the watch resumes.
func TestWatch_FaultDuringHangingGET(t *testing.T) {
	for _, fault := range []fake.Fault{fake.Fault5xx, fake.FaultRefused} {
		t.Run(fault.String(), func(t *testing.T) {
			f := fake.NewGCP(fake.GCPOptions{MaxWait: 50 * time.Millisecond})
			defer f.Close()
			ch, _ := metatest.Watch(t, newSource(f))
			metatest.WaitTotal(t, f, 4)
			f.SetFault(fault)
			metatest.WaitRequests(t, f, 6)
			metatest.NoNotice(t, ch)
			f.SetFault(fake.FaultNone)
			f.Maintenance(fake.GCPMaintenanceTerminate)
			if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
				t.Fatalf("notice=%+v, want termination", n)
			}
		})
	}
}
