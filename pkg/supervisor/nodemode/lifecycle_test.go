package nodemode

import (
	"context"
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
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// TestLifecycle_NoGoroutineLeftBehind starts and stops node agents many
// times, cancelled and signalled, and then finds no goroutine that any of
// them started still running: Run returns only once everything it started
// has finished. (pkg/supervisor's test of the same name covers its Run.)
func TestLifecycle_NoGoroutineLeftBehind(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	cycles := map[string]func(t *testing.T){
		"NodeCancel": func(t *testing.T) {
			cfg, sock := lifecycleNode(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg, nil) }()
			tr := trainertest.Dial(t, sock)
			helloRun(tr, "r1")
			tr.Expect(protocol.TypeWelcome)
			cancel() // stops the run at once; Run returns once it is done
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(2 * testutil.Wait):
				t.Fatal("Run did not return after its ctx ended")
			}
			tr.Close()
		},
		"Node": func(t *testing.T) {
			cfg, sock := lifecycleNode(t)
			sigs := make(chan os.Signal, 2)
			done := make(chan error, 1)
			go func() { done <- Run(context.Background(), cfg, sigs) }()
			stranger := trainertest.Dial(t, sock) // answered in the background (SendNoWait)
			stranger.Send(protocol.Message{Type: protocol.TypeDone, ID: "x"})
			stranger.Expect(protocol.TypeError)
			stranger.Close()
			tr := trainertest.Dial(t, sock)
			helloRun(tr, "r1")
			tr.Expect(protocol.TypeWelcome)
			sigs <- syscall.SIGTERM
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 3, "w")
			tr.Expect(protocol.TypeCommitted)
			tr.Expect(protocol.TypeStop)
			tr.Close()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(2 * testutil.Wait):
				t.Fatal("Run did not return")
			}
		},
	}
	for round := 0; round < 3; round++ {
		for name, cycle := range cycles {
			t.Run(name, cycle)
		}
	}
	goleak.VerifyNone(t, ignore)
}

// lifecycleNode is a node agent's config with file stores under a fresh
// dir, and its socket.
func lifecycleNode(t *testing.T) (Config, string) {
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "node.sock")
	return Config{
		StorePrefix: "file://" + filepath.Join(dir, "runs"), CheckpointRoot: filepath.Join(dir, "ckpt"),
		Source: noticetest.New(0), Log: zap.NewNop(),
		Server: protocol.ServerConfig{Path: sock, Identify: func(int, int) string { return "uid:test" }},
		OpenStore: func(ctx context.Context, uri string) (cloud.Store, error) {
			return file.New(strings.TrimPrefix(uri, "file://"))
		},
		Run: supervisor.Config{TermGrace: 5 * time.Second, Margin: time.Second, FenceInterval: 20 * time.Millisecond},
	}, sock
}
