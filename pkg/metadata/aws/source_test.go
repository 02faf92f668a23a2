package aws_test

import (
	"context"
	"math/bits"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/aws"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/metadata/internal/metatest"
)

const poll = 20 * time.Millisecond

func newSource(f *fake.AWS) *aws.Source {
	return aws.New(aws.Config{Endpoint: f.URL(), PollInterval: poll, RequestTimeout: 200 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond}, nil)
}

func TestIdentity(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{InstanceID: "i-0abc", InstanceType: "p4d.24xlarge", Zone: "us-west-2b", Lifecycle: "spot"})
	defer f.Close()
	id, err := newSource(f).Identity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := metadata.Identity{Cloud: "aws", InstanceID: "i-0abc", InstanceType: "p4d.24xlarge", Zone: "us-west-2b", Lifecycle: "spot"}
	if id != want {
		t.Fatalf("identity=%+v, want %+v", id, want)
	}
	if f.TokenRequests() < 1 {
		t.Fatalf("no IMDSv2 token requested")
	}
}

func TestWatch(t *testing.T) {
	t.Run("SpotTermination", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		at := time.Now().Add(2 * time.Minute).Truncate(time.Second)
		f.Terminate("stop", at)
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.Action != "stop" || n.Cloud != metadata.CloudAWS {
			t.Fatalf("notice=%+v, want termination/stop", n)
		}
		if !n.Deadline.Equal(at) {
			t.Fatalf("deadline=%v, want %v", n.Deadline, at)
		}
		if n.ID == "" || n.Raw == "" {
			t.Fatalf("notice without id or raw: %+v", n)
		}
		metatest.WaitRequests(t, f, 12) // three more polls: the same notice is not delivered again
		metatest.NoNotice(t, ch)
	})
	t.Run("SpotTerminationUnparseableTime", func(t *testing.T) {
		// A notice whose time does not parse is still a notice, with the
		// two minutes AWS gives, counted from when it was seen.
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		exposed := f.TerminateRaw("terminate", "tomorrow-ish")
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.Action != "terminate" {
			t.Fatalf("notice=%+v, want termination/terminate", n)
		}
		if lo, hi := exposed.Add(aws.SpotNoticeLead), time.Now().Add(aws.SpotNoticeLead); n.Deadline.Before(lo) || n.Deadline.After(hi) {
			t.Fatalf("deadline=%v, want two minutes after it was seen (%v..%v)", n.Deadline, lo, hi)
		}
		metatest.WaitRequests(t, f, 12)
		metatest.NoNotice(t, ch)
	})
	t.Run("MaintenanceUnparseableTime", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		exposed := f.Maintenance(fake.AWSEvent{EventID: "instance-event-2", Code: "instance-stop", NotBeforeRaw: "next Tuesday"})
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindMaintenance || n.ID != "instance-event-2" || n.Deadline.Before(exposed) || n.Deadline.After(time.Now()) {
			t.Fatalf("notice=%+v, want maintenance instance-event-2 due at once", n)
		}
		metatest.WaitRequests(t, f, 12)
		metatest.NoNotice(t, ch)
	})
	t.Run("DespiteMetadataDisabledForCredentials", func(t *testing.T) {
		// AWS_EC2_METADATA_DISABLED turns the SDK's credential lookups off;
		// an explicitly opened notice source still watches.
		t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		f.Terminate("terminate", time.Now().Add(2*time.Minute))
		if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
			t.Fatalf("notice=%+v, want termination", n)
		}
	})
	t.Run("Rebalance", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		f.Rebalance(time.Now())
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindRebalance || !n.Deadline.IsZero() {
			t.Fatalf("notice=%+v, want rebalance without deadline", n)
		}
	})
	t.Run("MaintenanceThenCancelled", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		nb := time.Date(2031, 1, 21, 9, 0, 43, 0, time.UTC)
		f.Maintenance(fake.AWSEvent{EventID: "instance-event-0d59937288b749b32", Code: "system-reboot", NotBefore: nb, NotAfter: nb.Add(17 * time.Minute)})
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindMaintenance || n.ID != "instance-event-0d59937288b749b32" || n.Action != "system-reboot" || !n.Deadline.Equal(nb) {
			t.Fatalf("notice=%+v, want maintenance system-reboot at %v", n, nb)
		}
		f.CancelMaintenance("instance-event-0d59937288b749b32")
		n = metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindCancelled || n.ID != "instance-event-0d59937288b749b32" {
			t.Fatalf("notice=%+v, want cancelled with the same id", n)
		}
	})
	t.Run("PastEventNotAnnounced", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		f.Maintenance(fake.AWSEvent{EventID: "instance-event-1", Code: "system-reboot", State: "completed", NotBefore: time.Now().Add(-time.Hour)})
		ch, _ := metatest.Watch(t, newSource(f))
		metatest.WaitRequests(t, f, 12)
		metatest.NoNotice(t, ch)
	})
	t.Run("AutoScalingTerminated", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		f.SetLifecycleState("InService")
		ch, _ := metatest.Watch(t, newSource(f))
		metatest.WaitRequests(t, f, 8)
		metatest.NoNotice(t, ch)
		f.SetLifecycleState("Terminated")
		n := metatest.Next(t, ch, 10*time.Second)
		if n.Kind != metadata.KindTermination || n.Action != "asg-terminated" {
			t.Fatalf("notice=%+v, want asg termination", n)
		}
	})
	t.Run("ExpiredTokenGetsFreshOne", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		ch, _ := metatest.Watch(t, newSource(f))
		metatest.WaitRequests(t, f, 8)
		before := f.TokenRequests()
		f.RevokeTokens()
		f.Terminate("terminate", time.Now().Add(2*time.Minute))
		if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
			t.Fatalf("notice=%+v, want termination", n)
		}
		if got := f.TokenRequests(); got <= before {
			t.Fatalf("token requests=%d after revocation, want more than %d", got, before)
		}
	})
	t.Run("StopsPromptlyWhileRequestHangs", func(t *testing.T) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		f.SetFault(fake.FaultHang)
		src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: poll, RequestTimeout: time.Minute}, nil)
		_, stop := metatest.Watch(t, src)
		metatest.WaitTotal(t, f, 1) // the one request, hanging
		stop()                      // fails the test unless Watch returns within 5 s, not the minute of the request
	})
}

// TestWatch_Faults: every fault is survived without a notice, and a notice
// exposed after the fault heals is delivered.
func TestWatch_Faults(t *testing.T) {
	for _, fault := range fake.Faults {
		t.Run(fault.String(), func(t *testing.T) {
			f := fake.NewAWS(fake.AWSOptions{})
			defer f.Close()
			f.SetLifecycleState("InService")
			f.SetFault(fault)
			ch, _ := metatest.Watch(t, newSource(f))
			metatest.WaitRequests(t, f, 6)
			metatest.NoNotice(t, ch)
			f.SetFault(fake.FaultNone)
			f.Terminate("terminate", time.Now().Add(2*time.Minute))
			if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
				t.Fatalf("notice=%+v, want termination", n)
			}
		})
	}
}

func TestWatch_HangingTokenEndpoint(t *testing.T) {
	// Only the token PUT hangs: the hop-limit problem in containers.
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	f.SetTokenFault(fake.FaultHang)
	src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: poll, RequestTimeout: 100 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := src.Identity(ctx); err == nil {
		t.Fatal("identity succeeded without a token")
	}
	// Well under the context's 30 s: the 100 ms request timeout ended it
	// (with slack for a loaded machine).
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("identity took %v against a hanging token endpoint, want about the request timeout", d)
	}
	ch, _ := metatest.Watch(t, src)
	f.Terminate("terminate", time.Now().Add(2*time.Minute))
	metatest.WaitRequests(t, f, 6)
	metatest.NoNotice(t, ch) // without a token IMDSv2 answers nothing, not even the notice
	f.SetTokenFault(fake.FaultNone)
	if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
		t.Fatalf("notice=%+v, want termination", n)
	}
}

// TestWatch_SpotPathReadMoreOften: spot/instance-action, the one notice
// with a fixed two-minute deadline, is read every SpotPollInterval; the
// other paths only every PollInterval (here an hour: once, at start).
func TestWatch_SpotPathReadMoreOften(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: time.Hour, SpotPollInterval: 5 * time.Millisecond,
		RequestTimeout: 200 * time.Millisecond}, nil)
	ch, _ := metatest.Watch(t, src)
	metatest.WaitFor(t, 10*time.Second, "ten spot reads", func() bool { return f.Reads("spot/instance-action") >= 10 })
	for _, p := range []string{"autoscaling/target-lifecycle-state", "events/maintenance/scheduled", "events/recommendations/rebalance"} {
		if n := f.Reads(p); n != 1 {
			t.Errorf("%s read %d times during ten spot reads, want 1 (every PollInterval)", p, n)
		}
	}
	f.Terminate("terminate", time.Now().Add(2*time.Minute))
	if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
		t.Fatalf("notice=%+v, want termination", n)
	}
}

// TestWatch_SpotPollIntervalCapped: a SpotPollInterval above PollInterval
// is PollInterval: every path is read every round.
func TestWatch_SpotPollIntervalCapped(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: 5 * time.Millisecond, SpotPollInterval: time.Hour,
		RequestTimeout: 200 * time.Millisecond}, nil)
	metatest.Watch(t, src)
	metatest.WaitFor(t, 10*time.Second, "five rounds", func() bool { return f.Reads("events/recommendations/rebalance") >= 5 })
	if n := f.Reads("spot/instance-action"); n < 5 {
		t.Fatalf("spot path read %d times in five rounds, want ≥ 5", n)
	}
}

// TestWatch_GarbageElsewhereKeepsSpotCadence: a path that answers but does
// not parse is a logged fault, not an IMDS outage: no backoff and no extra
// full rounds, so the spot path is still read every SpotPollInterval, four
// times per read of the bad path here (MaxBackoff is an hour: a backoff
// would stall the test).
func TestWatch_GarbageElsewhereKeepsSpotCadence(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	f.SetLifecycleState("Pending:Garbage")
	core, logs := observer.New(zap.InfoLevel)
	src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: 20 * time.Millisecond, SpotPollInterval: 5 * time.Millisecond,
		RequestTimeout: 200 * time.Millisecond, MaxBackoff: time.Hour}, zap.New(core))
	ch, _ := metatest.Watch(t, src)
	metatest.WaitFor(t, 10*time.Second, "five reads of the bad path", func() bool { return f.Reads("autoscaling/target-lifecycle-state") >= 5 })
	if bad, spot := f.Reads("autoscaling/target-lifecycle-state"), f.Reads("spot/instance-action"); spot < 3*bad {
		t.Fatalf("spot path read %d times against %d reads of the bad path, want ≥ 3× (its own cadence)", spot, bad)
	}
	// The bad path fails every full round: one failure run, logged at 1,
	// 2, 4, ... in a row, never "recovered" by the spot-only rounds between.
	if n := logs.FilterMessage("imds poll recovered").Len(); n != 0 {
		t.Fatalf("%d \"recovered\" logs while the bad path kept failing, want 0", n)
	}
	failed := logs.FilterMessage("imds poll failed").Len()
	if bad := f.Reads("autoscaling/target-lifecycle-state"); failed > bits.Len(uint(bad)) {
		t.Fatalf("%d \"failed\" logs for at most %d failures in a row, want ≤ %d (the 1st, 2nd, 4th, ...)", failed, bad, bits.Len(uint(bad)))
	}
	f.Terminate("terminate", time.Now().Add(2*time.Minute))
	if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
		t.Fatalf("notice=%+v, want termination", n)
	}
}

// TestWatch_OutageBacksOffAllPaths: while IMDS answers 5xx, the spot path is
// not hammered at its own cadence: rounds wait PollInterval or longer.
func TestWatch_OutageBacksOffAllPaths(t *testing.T) {
	f := fake.NewAWS(fake.AWSOptions{})
	defer f.Close()
	f.SetFault(fake.Fault5xx)
	src := aws.New(aws.Config{Endpoint: f.URL(), PollInterval: 300 * time.Millisecond, SpotPollInterval: time.Millisecond,
		RequestTimeout: 200 * time.Millisecond, MaxBackoff: 300 * time.Millisecond}, nil)
	ch, _ := metatest.Watch(t, src)
	start := time.Now()
	metatest.WaitTotal(t, f, 64)
	// A round makes at most 16 requests (4 paths, each a token PUT and a
	// GET retried once), so 64 take ≥ 4 rounds: at a 1 ms cadence a few
	// milliseconds, backed off at least three waits of ≥ 150 ms (the
	// backoff's jitter floor).
	if d := time.Since(start); d < 450*time.Millisecond {
		t.Fatalf("64 requests in %v during an outage, want ≥ 450ms (backoff)", d)
	}
	f.SetFault(fake.FaultNone)
	f.Terminate("terminate", time.Now().Add(2*time.Minute))
	if n := metatest.Next(t, ch, 10*time.Second); n.Kind != metadata.KindTermination {
		t.Fatalf("notice=%+v, want termination", n)
	}
}
