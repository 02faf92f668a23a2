package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/metadata/aws"
	"github.com/spotagent/spotagent/pkg/metadata/azure"
	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/metadata/gcp"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// flapFor is how long the metadata service flaps: 6 s in `make test`;
// SPOTAGENT_SOAK=<duration> (say 10m) for the soak, SPOTAGENT_SOAK=1 for 5m.
func flapFor() time.Duration {
	v := os.Getenv("SPOTAGENT_SOAK")
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return 5 * time.Minute
	}
	return 6 * time.Second
}

// TestAgent_MetadataFaults (issue 8; the end-to-end TestMetadataFault_*
// until #49): a metadata service that flaps through every fault, and an
// IMDSv2 token endpoint that hangs after its tokens were revoked, neither
// stop the periodic checkpoints nor make a false notice; a real notice
// after they heal still gets its interruption checkpoint and the trainer
// stopped. Each cloud's real source polls its fake over HTTP; what each
// source does with each fault is its own package's TestWatch_Faults.
func TestAgent_MetadataFaults(t *testing.T) {
	for _, c := range []struct {
		name  string
		what  string // the source's fault log: "<what> failed" / "<what> recovered"
		start func(*zap.Logger) (fake.Server, metadata.Source)
		token bool // also hang the IMDSv2 token endpoint between data faults
	}{
		{"aws", "imds poll", func(log *zap.Logger) (fake.Server, metadata.Source) {
			f := fake.NewAWS(fake.AWSOptions{})
			return f, aws.New(aws.Config{Endpoint: f.URL(), PollInterval: 200 * time.Millisecond}, log)
		}, false},
		{"aws-token", "imds poll", func(log *zap.Logger) (fake.Server, metadata.Source) {
			f := fake.NewAWS(fake.AWSOptions{})
			return f, aws.New(aws.Config{Endpoint: f.URL(), PollInterval: 200 * time.Millisecond}, log)
		}, true},
		// Hanging GETs end every 500 ms (GCE allows up to timeout_sec),
		// so that the faults reach the watch as new requests.
		{"gcp", "metadata watch", func(log *zap.Logger) (fake.Server, metadata.Source) {
			f := fake.NewGCP(fake.GCPOptions{MaxWait: 500 * time.Millisecond})
			return f, gcp.New(gcp.Config{Host: f.URL()}, log)
		}, false},
		{"azure", "scheduled events poll", func(log *zap.Logger) (fake.Server, metadata.Source) {
			f := fake.NewAzure(fake.AzureOptions{})
			return f, azure.New(azure.Config{Endpoint: f.URL(), PollInterval: 200 * time.Millisecond}, log)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(zap.InfoLevel)
			srv, src := c.start(zap.New(core))
			t.Cleanup(srv.Close)
			exitFile := filepath.Join(testutil.ShortDir(t), "exit")
			ar := startAgent(t, func(cfg *Config) {
				cfg.Source = src
				cfg.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Second})
				// The trainer process ends when the test says so, as a
				// trainer does after its stop.
				cfg.Command = []string{"/bin/sh", "-c", "while [ ! -e " + exitFile + " ]; do sleep 0.05; done"}
				cfg.Log = zap.New(core)
			})
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			answer := func(within time.Duration) (protocol.Message, bool) {
				req, ok := tr.Next(protocol.TypeCheckpoint, within)
				if ok {
					tr.Save(req, 1, req.ID)
				}
				return req, ok
			}
			if _, ok := answer(testutil.Wait); !ok {
				t.Fatal("no periodic request before the faults")
			}

			// Every fault in turn for 1 s, 0.5 s healthy between; the
			// sleeps are how long a fault lasts (fault injection).
			flapped := make(chan time.Duration, 1) // not left blocked by a failed test
			go func() {
				start := time.Now()
				for i := 0; time.Since(start) < flapFor(); i++ {
					srv.SetFault(fake.Faults[i%len(fake.Faults)])
					time.Sleep(time.Second)
					srv.SetFault(fake.FaultNone)
					if c.token {
						srv.(*fake.AWS).RevokeTokens()
						srv.(*fake.AWS).SetTokenFault(fake.FaultHang)
						// Longer than the source's 2 s request timeout:
						// a token request times out, not only reset.
						time.Sleep(3 * time.Second)
						srv.(*fake.AWS).SetTokenFault(fake.FaultNone)
					}
					time.Sleep(500 * time.Millisecond)
				}
				flapped <- time.Since(start)
			}()
			answered := 0
			var took time.Duration
			for took == 0 {
				select {
				case took = <-flapped:
				default:
					req, ok := answer(100 * time.Millisecond)
					if ok && req.Reason != protocol.ReasonPeriodic {
						t.Fatalf("a %s request while the metadata service flapped: %+v", req.Reason, req)
					}
					if ok {
						answered++
					}
				}
			}
			// The interval is 1 s and a commit takes milliseconds: one
			// every 3 s is a floor only a stalled loop misses.
			if want := int(took / (3 * time.Second)); answered < want {
				t.Fatalf("%d periodic requests answered in %s of metadata faults, want at least %d", answered, took, want)
			}
			t.Logf("flapped for %s: %d periodic checkpoints answered meanwhile", took.Round(time.Second), answered)
			if n := logs.FilterMessage("interruption notice").Len(); n > 0 {
				t.Fatalf("%d false notices while the metadata service flapped", n)
			}
			if n := logs.FilterMessage("checkpoint not committed").Len(); n > 0 {
				t.Fatalf("%d checkpoints failed while the metadata service flapped", n)
			}
			// The recovery is logged at the source's first good answer
			// after the faults: up to its 10 s backoff ceiling after the
			// last one, plus the poll.
			testutil.WaitWithin(t, "the "+c.what+" failed/recovered log lines (none: the faults did not reach the source)", 30*time.Second, func() bool {
				return logs.FilterMessage(c.what+" failed").Len() > 0 && logs.FilterMessage(c.what+" recovered").Len() > 0
			})

			srv.Notice()
			// Every request is answered until the stop: the interruption
			// checkpoint is a new request, or the periodic one pending at
			// the notice (asked as periodic, committed as the interruption's).
			deadline := time.After(time.Minute)
			for stopped := false; !stopped; {
				select {
				case m, ok := <-tr.Msgs():
					if !ok {
						t.Fatal("connection closed before the stop")
					}
					switch m.Type {
					case protocol.TypeCheckpoint:
						tr.Save(m, 1, m.ID)
					case protocol.TypeStop:
						if m.Reason != protocol.ReasonInterruption {
							t.Fatalf("stop %+v, want reason interruption", m)
						}
						stopped = true
					}
				case <-deadline:
					t.Fatal("no stop within a minute of the healed service's notice")
				}
			}
			if n := logs.FilterMessage("interruption checkpoint committed: stopping the trainer").Len(); n != 1 {
				t.Fatalf("%d 'interruption checkpoint committed' lines before the stop, want 1", n)
			}
			if err := os.WriteFile(exitFile, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if code := ar.wait(t); code != ExitInterrupted {
				t.Fatalf("exit code %d, want %d", code, ExitInterrupted)
			}
			if es := logs.FilterMessage("interruption notice").All(); len(es) != 1 || es[0].ContextMap()["kind"] != string(metadata.KindTermination) {
				t.Fatalf("notices logged: %v, want one termination", es)
			}
		})
	}
}
