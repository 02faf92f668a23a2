package metadata_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/aws"
	"github.com/spotagent/spotagent/pkg/metadata/azure"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/metadata/gcp"
)

const latencyNotices = 50

// BenchmarkNoticeLatency measures, per cloud, the time from the fake server
// exposing a notice to the notice arriving on the Watch channel, over 50
// notices at the default poll interval (1s), and reports p50/p99/max in ms.
// Each notice is exposed at a random phase of the poll period, so AWS and
// Azure take about 50 poll periods each:
//
//	go test -run x -bench NoticeLatency -benchtime 1x ./pkg/metadata/
func BenchmarkNoticeLatency(b *testing.B) {
	b.Run("aws", func(b *testing.B) {
		f := fake.NewAWS(fake.AWSOptions{})
		defer f.Close()
		at := time.Now().Add(2 * time.Minute).Truncate(time.Second)
		i := 0
		measure(b, aws.New(aws.Config{Endpoint: f.URL()}, nil), time.Second, func() time.Time {
			i++ // a new time, a new body, a new notice
			return f.Terminate("terminate", at.Add(time.Duration(i)*time.Second))
		})
	})
	b.Run("gcp", func(b *testing.B) {
		f := fake.NewGCP(fake.GCPOptions{})
		defer f.Close()
		migrate := false
		measure(b, gcp.New(gcp.Config{Host: f.Host()}, nil), 20*time.Millisecond, func() time.Time {
			migrate = !migrate // maintenance, then its cancellation
			if migrate {
				return f.Maintenance(fake.GCPMaintenanceMigrate)
			}
			return f.Maintenance(fake.GCPMaintenanceNone)
		})
	})
	b.Run("azure", func(b *testing.B) {
		f := fake.NewAzure(fake.AzureOptions{})
		defer f.Close()
		var last string
		measure(b, azure.New(azure.Config{Endpoint: f.URL()}, nil), time.Second, func() time.Time {
			if last != "" { // its cancellation
				t := f.RemoveEvent(last)
				last = ""
				return t
			}
			ev, t := f.Preempt()
			last = ev.EventId
			return t
		})
	})
}

// measure watches src and, 50 times per iteration, waits a random part of
// phase, calls expose and times the arrival of the next notice.
func measure(b *testing.B, src metadata.Source, phase time.Duration, expose func() time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan metadata.Notice, 1)
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Watch(ctx, ch) }()
	defer func() { cancel(); <-done }()
	if err := waitReady(ctx, src); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		for range latencyNotices {
			time.Sleep(rand.N(phase)) // a random phase of the poll period, not synchronisation
			exposed := expose()
			select {
			case <-ch:
				lat = append(lat, time.Since(exposed))
			case <-time.After(10 * time.Second):
				b.Fatal("no notice within 10s")
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Millisecond), "max_ms")
	b.ReportMetric(0, "ns/op")
}

// waitReady waits until the source answers, so that start-up is not measured.
func waitReady(ctx context.Context, src metadata.Source) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := src.Identity(ctx)
	return err
}
