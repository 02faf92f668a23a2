package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestAgent_HeldStoreLockDoesNotStretchExit (review, item 3): with the
// store's lock held by another process, a SIGTERM'd agent used to wait
// 10s for its journal writes, then up to a minute more behind the one it
// had abandoned, and name "list leases: context deadline exceeded". Every
// exit-time wait now ends exitWait after the loop's end, where the writes
// still in flight are cancelled (nothing queues behind them); the log says
// what it waits for and for how long, and the error names the lock.
func TestAgent_HeldStoreLockDoesNotStretchExit(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	const grace = 2 * time.Second
	ar := startAgent(t, func(c *Config) { c.TermGrace = grace; c.Log = zap.New(core) })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	holder, err := os.OpenFile(filepath.Join(ar.store.Root(), ".spotagent-lock"), os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	tr.Save(req, 7, "weights")
	tr.Close() // the trainer exits; its checkpoint cannot commit under the lock
	// The bound below, not testutil.Wait: the exit may wait exitWait.
	select {
	case code := <-ar.done:
		ar.done <- code
	case <-time.After(grace + exitWait + time.Second + 20*time.Second):
		t.Fatal("agent did not exit")
	}
	// The bound is the guarantee, not a speed target: the grace, the exit's
	// wait, the second the session's last write may take past it, and slack
	// for a loaded machine; it took over 60s before.
	if took := time.Since(sent); took > grace+exitWait+time.Second+4*time.Second {
		t.Fatalf("agent exited %s after SIGTERM with --term-grace %s and the store lock held", took, grace)
	}
	waiting := logs.FilterMessageSnippet("exit: waiting for the journal writes").All()
	if len(waiting) == 0 || waiting[0].ContextMap()["at_most"] == nil {
		t.Fatalf("the exit did not say what it waits for, with a duration: %v", logs.All())
	}
	var named bool
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if f.Key == "error" && strings.Contains(f.Interface.(error).Error(), "store lock ") {
				named = true
			}
		}
	}
	if !named {
		t.Fatalf("no logged error names the store lock: %v", logs.All())
	}
}
