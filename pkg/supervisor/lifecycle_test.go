package supervisor

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// blockingStore holds every Put of a checkpoint's data file until its ctx
// ends, and says on entered when one is held: a commit the test can stop
// the agent in the middle of.
type blockingStore struct {
	cloud.Store
	entered chan string
}

func (s *blockingStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	if strings.HasSuffix(key, "state.bin") {
		select {
		case s.entered <- key:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Put(ctx, key, r, size, opts)
}

// lifecycleAgent runs one agent until it returns, with its own ctx, and
// gives the trainer connections it made back to the caller to close.
type lifecycleAgent struct {
	cfg    Config
	sigs   chan os.Signal
	cancel context.CancelFunc
	done   chan int
}

func runLifecycleAgent(t *testing.T, dir string, mutate func(*Config)) *lifecycleAgent {
	t.Helper()
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		RunID: "life", CheckpointDir: filepath.Join(dir, "ckpt"), Store: st,
		Server:    protocol.ServerConfig{Path: filepath.Join(dir, "a.sock")},
		Scheduler: schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Hour}),
		Source:    noticetest.New(0),
		TermGrace: 5 * time.Second, KillAfter: time.Second, FenceInterval: 20 * time.Millisecond, Log: zap.NewNop(),
		SignalWindow: -1,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	la := &lifecycleAgent{cfg: cfg, sigs: make(chan os.Signal, 2), cancel: cancel, done: make(chan int, 1)}
	go func() {
		code, err := Run(ctx, cfg, la.sigs)
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		la.done <- code
	}()
	return la
}

// wait returns Run's exit code, failing the test if Run does not return.
func (la *lifecycleAgent) wait(t *testing.T) int {
	t.Helper()
	defer la.cancel()
	select {
	case code := <-la.done:
		return code
	case <-time.After(2 * testutil.Wait):
		t.Fatal("Run did not return")
	}
	return -1
}

// TestLifecycle_NoGoroutineLeftBehind starts and stops agents many times,
// in every mode and with a stop in the middle of a commit, and then finds
// no goroutine that any of them started still running: Run returns only once everything they started has finished.
func TestLifecycle_NoGoroutineLeftBehind(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	cycles := map[string]func(t *testing.T){
		"RunWithChild": func(t *testing.T) {
			la := runLifecycleAgent(t, testutil.ShortDir(t), func(c *Config) { c.Command = []string{"/bin/sh", "-c", "sleep 60"} })
			tr := trainertest.Dial(t, la.cfg.Server.Path)
			tr.Hello()
			la.sigs <- syscall.SIGTERM
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 7, "w")
			tr.Expect(protocol.TypeCommitted)
			tr.Expect(protocol.TypeStop)
			la.sigs <- syscall.SIGTERM // the child ignores stop: the second signal ends it
			la.wait(t)
			tr.Close()
		},
		"SignalBridge": func(t *testing.T) {
			la := runLifecycleAgent(t, testutil.ShortDir(t), func(c *Config) {
				c.Command = []string{"/bin/sh", "-c", "sleep 60"}
				c.Signal = syscall.SIGUSR1
			})
			c, err := protocol.Dial(context.Background(), la.cfg.Server.Path)
			for deadline := time.Now().Add(testutil.Wait); err != nil && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond) // polling for the socket, bounded by deadline
				c, err = protocol.Dial(context.Background(), la.cfg.Server.Path)
			}
			if err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, "the bridge's hello", func() bool {
				raw, err := c.Status(context.Background())
				return err == nil && strings.Contains(string(raw), `"trainers":1`)
			})
			c.Close()
			la.sigs <- syscall.SIGTERM
			la.sigs <- syscall.SIGTERM
			la.wait(t)
		},
		"Sidecar": func(t *testing.T) {
			la := runLifecycleAgent(t, testutil.ShortDir(t), nil)
			tr := trainertest.Dial(t, la.cfg.Server.Path)
			tr.Hello()
			la.sigs <- syscall.SIGTERM
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 7, "w")
			tr.Expect(protocol.TypeCommitted)
			tr.Expect(protocol.TypeStop)
			if code := la.wait(t); code != 0 {
				t.Errorf("exit code %d, want 0", code)
			}
			tr.Close()
		},
		"StopDuringCommit": func(t *testing.T) {
			dir := testutil.ShortDir(t)
			entered := make(chan string, 1)
			la := runLifecycleAgent(t, dir, func(c *Config) {
				c.Store = &blockingStore{Store: c.Store, entered: entered}
				c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 20 * time.Millisecond})
			})
			tr := trainertest.Dial(t, la.cfg.Server.Path)
			tr.Hello()
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 1, "w")
			select {
			case <-entered:
			case <-time.After(testutil.Wait):
				t.Fatal("the commit did not start uploading")
			}
			la.cancel() // stop now, the upload still in flight
			la.wait(t)
			tr.Close()
		},
	}
	for round := 0; round < 3; round++ {
		for name, cycle := range cycles {
			t.Run(name, cycle)
		}
	}
	goleak.VerifyNone(t, ignore)
}
