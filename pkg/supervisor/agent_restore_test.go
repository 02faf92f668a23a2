package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestAgent_OverlapRestoreSignal: SIGTERM while the restore runs beside
// the trainer's start (its files held by the store): the restore is
// cancelled, the waiting trainer told restore_failed, the trainer process
// stopped, and Run exits 143 as a cancelled start does. The env said
// SPOTAGENT_RESUME=pending.
func TestAgent_OverlapRestoreSignal(t *testing.T) {
	gated := newGatedStore(t, false)
	envOut := filepath.Join(testutil.ShortDir(t), "env")
	ar := startAgentErr(t, func(c *Config) {
		c.Store, c.OverlapRestore = gated, true
		c.Command = []string{"/bin/sh", "-c", `env > ` + envOut + `.tmp && mv ` + envOut + `.tmp ` + envOut + `; sleep 60`}
	}, true)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := tr.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil || w.Version != 2 {
		t.Fatalf("welcome %+v, want version 2, restore pending, no resume", w)
	}
	testutil.WaitFor(t, "the trainer's environment", func() bool { _, err := os.Stat(envOut); return err == nil })
	env, err := os.ReadFile(envOut)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "SPOTAGENT_RESUME=pending\n") || strings.Contains(string(env), "SPOTAGENT_RESUME_DIR=") {
		t.Fatalf("trainer environment does not say the restore is pending:\n%s", env)
	}
	ar.sigs <- syscall.SIGTERM
	if f := tr.Expect(protocol.TypeRestoreFailed); !strings.Contains(f.Error, "restore cancelled") {
		t.Fatalf("restore_failed %q, want it to say the restore was cancelled", f.Error)
	}
	if code := ar.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit code %d, want 143", code)
	}
}

// TestAgent_OverlapRestoreHeldWelcome: a protocol 1 trainer that connects
// while the restore runs gets no welcome until the restore is in place,
// and then the resume; a protocol 2 trainer gets restored, with the same
// files in place.
func TestAgent_OverlapRestoreHeldWelcome(t *testing.T) {
	gated := newGatedStore(t, false)
	ar := startAgent(t, func(c *Config) { c.Store, c.OverlapRestore = gated, true })
	v2 := trainertest.Dial(t, ar.cfg.Server.Path)
	v2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	v2.Expect(protocol.TypeWelcome)
	v1 := trainertest.Dial(t, ar.cfg.Server.Path)
	v1.Send(map[string]any{"type": "hello", "pid": os.Getpid()})
	// The v1 hello is in the loop before the store is released: a status
	// round trip on the same connection comes after it.
	v1.Send(map[string]any{"type": "status"})
	if m := v1.Expect(protocol.TypeStatus); m.Type != protocol.TypeStatus {
		t.Fatalf("got %+v", m)
	}
	gated.release()
	r := v2.Expect(protocol.TypeRestored)
	w := v1.Expect(protocol.TypeWelcome)
	for _, res := range []*protocol.Resume{r.Resume, w.Resume} {
		if res == nil || res.Step != 7 || res.ID != "60d0000000a7" {
			t.Fatalf("resume %+v, want step 7", res)
		}
		b, err := os.ReadFile(filepath.Join(res.Dir, "b.bin"))
		if err != nil || string(b) != "second file" {
			t.Fatalf("restored b.bin = %q %v", b, err)
		}
	}
	if w.Version != 1 || w.Restore != "" {
		t.Fatalf("welcome to protocol 1: %+v", w)
	}
}

// TestAgent_TrainerThatExitsAtOnceRecordsNoFleet (#41 item 5): a trainer
// that exits while the restore still runs beside its start leaves no
// session in the journal: the agent writes no fleet record and warns of
// nothing (it once warned "journal has no sessions").
func TestAgent_TrainerThatExitsAtOnceRecordsNoFleet(t *testing.T) {
	gated := newGatedStore(t, false)
	defer gated.release()
	fl, err := file.New(testutil.ShortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	ar := startAgentErr(t, func(c *Config) {
		c.Store, c.OverlapRestore, c.Fleet, c.FleetDir = gated, true, fl, "r1"
		c.Command = []string{"/bin/sh", "-c", "exit 0"}
		c.Log = zap.New(core)
	}, true)
	ar.wait(t)
	for _, e := range logs.All() {
		if e.Level >= zap.WarnLevel && strings.Contains(e.Message+fmt.Sprint(e.ContextMap()), "fleet") {
			t.Errorf("%v %q %v", e.Level, e.Message, e.ContextMap())
		}
	}
	if logs.FilterMessageSnippet("no fleet record").Len() != 1 {
		t.Errorf("no debug line says why no fleet record was written")
	}
	n := 0
	fl.List(context.Background(), "", func(cloud.ObjectInfo) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d objects in the fleet store after a session that never began", n)
	}
}
