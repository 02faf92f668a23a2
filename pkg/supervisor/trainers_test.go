package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
)

// Issue 36 (hostile review): a connected client that says hello and then
// never answers holds no checkpoint hostage, the interruption one
// included: the request goes to the job's declared ranks only.
func TestAgent_SilentClientHoldsNoCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name          string
		trainer       map[string]any   // the job's trainer's hello
		silent, ranks []map[string]any // hellos of clients that then never answer; more ranks of the job
	}{
		{name: "SingleProcess", trainer: map[string]any{"type": "hello"},
			silent: []map[string]any{{"type": "hello"}, {"type": "hello", "rank": 0, "world_size": 1},
				{"type": "hello", "rank": 1, "world_size": 2}}},
		{name: "Ranks", trainer: map[string]any{"type": "hello", "rank": 0, "world_size": 2},
			ranks: []map[string]any{{"type": "hello", "rank": 1, "world_size": 2}},
			silent: []map[string]any{{"type": "hello"}, {"type": "hello", "rank": 1, "world_size": 2},
				{"type": "hello", "rank": 7, "world_size": 8}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := noticetest.New(1)
			ar := startAgent(t, func(c *Config) { c.Source = src })
			say := func(h map[string]any) *trainertest.Trainer {
				tr := trainertest.Dial(t, ar.cfg.Server.Path)
				tr.Send(h)
				tr.Expect(protocol.TypeWelcome)
				return tr
			}
			job := []*trainertest.Trainer{say(tc.trainer)}
			for _, h := range tc.ranks {
				job = append(job, say(h))
			}
			var silent []*trainertest.Trainer
			for _, h := range tc.silent {
				silent = append(silent, say(h))
			}
			ar.waitStatus(t, "every hello taken in", func(s Status) bool { return s.Trainers == len(job)+len(silent) })
			// A join would make the request wait for it: refused.
			last := silent[len(silent)-1]
			last.Send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "interruption", "deadline": time.Now().Add(time.Minute)})
			if e := last.Expect(protocol.TypeError); !strings.Contains(e.Error, "not one of the job's declared ranks") {
				t.Fatalf("join from a silent client: %q", e.Error)
			}
			now := time.Now()
			src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
			var id string
			for i, tr := range job {
				req := tr.Expect(protocol.TypeCheckpoint)
				id = req.ID
				testutil.WriteFile(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d", i)), "w")
				tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 17})
			}
			// Committed well before the silent clients' deadline (a minute).
			for _, tr := range job {
				if c := tr.Expect(protocol.TypeCommitted); c.ID != id {
					t.Fatalf("committed %+v, want %s", c, id)
				}
			}
			for _, tr := range silent {
				if m := tr.Expect(protocol.TypeCommitted); m.ID != id { // never asked: its first message is the commit
					t.Fatalf("silent client got %+v", m)
				}
			}
			if got := latestStep(t, ar); got != 17 {
				t.Fatalf("latest step %d, want 17", got)
			}
			for _, tr := range append(job, silent...) {
				tr.Expect(protocol.TypeStop)
			}
			testutil.WaitFor(t, "the interruption journaled as committed", func() bool {
				j, err := journal.Read(context.Background(), ar.store, "test")
				return err == nil && len(j.Interruptions) == 1 && j.Interruptions[0].CommitOK
			})
		})
	}
}

// childTrainer is the agent's child: once the file argv[2] exists it
// connects to argv[1], says hello with no rank and answers each
// checkpoint request at step 21, then exits on stop.
const childTrainer = `
import json, os, socket, sys, time
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"type":"hello","pid":%d}\n' % os.getpid())
for line in s.makefile("rb"):
    m = json.loads(line)
    if m["type"] == "checkpoint":
        open(os.path.join(m["dir"], "w"), "w").write("21")
        s.sendall(json.dumps({"type": "done", "id": m["id"], "step": 21}).encode() + b"\n")
    if m["type"] == "stop":
        break
`

// Under spotagent run, the child's own connection is the job even when
// another client said hello first: that one cannot take the trainer's
// place (docs/protocol.md, "Who a checkpoint waits for").
func TestAgent_ChildGoesFirst(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatalf("this test runs a trainer under /usr/bin/python3: %v", err)
	}
	gate := filepath.Join(t.TempDir(), "go")
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/usr/bin/python3", "-c", childTrainer, c.Server.Path, gate}
	})
	first := trainertest.Dial(t, ar.cfg.Server.Path)
	first.Send(map[string]any{"type": "hello"})
	first.Expect(protocol.TypeWelcome)
	ar.waitStatus(t, "the first client's hello", func(s Status) bool { return s.Trainers == 1 })
	testutil.WriteFile(t, gate, "")
	ar.waitStatus(t, "the child's hello", func(s Status) bool { return s.Trainers == 2 })
	ar.sigs <- syscall.SIGTERM
	if m := first.Expect(protocol.TypeCommitted); m.Step == nil || *m.Step != 21 {
		t.Fatalf("first client got %+v, want the child's commit at step 21 (and no request)", m)
	}
	if got := latestStep(t, ar); got != 21 {
		t.Fatalf("latest step %d, want the child's 21", got)
	}
}

// A client left out while the trainer was connected stays behind the
// trainer that comes back after a restart (sidecar: no child to tell
// them apart): it cannot take the job's place in between.
func TestAgent_LeftOutStaysBehindARestartedTrainer(t *testing.T) {
	ar := startAgent(t, nil)
	hello := func() *trainertest.Trainer {
		tr := trainertest.Dial(t, ar.cfg.Server.Path)
		tr.Send(map[string]any{"type": "hello"})
		tr.Expect(protocol.TypeWelcome)
		return tr
	}
	old := hello()
	ar.waitStatus(t, "the trainer's hello", func(s Status) bool { return s.Trainers == 1 })
	silent := hello()
	ar.waitStatus(t, "the silent client's hello", func(s Status) bool { return s.Trainers == 2 })
	old.Close() // the trainer restarts
	ar.waitStatus(t, "the trainer gone", func(s Status) bool { return s.Trainers == 1 })
	back := hello()
	ar.waitStatus(t, "the trainer back", func(s Status) bool { return s.Trainers == 2 })
	ar.sigs <- syscall.SIGTERM
	req := back.Expect(protocol.TypeCheckpoint)
	back.Save(req, 33, "w")
	if m := silent.Expect(protocol.TypeCommitted); m.ID != req.ID {
		t.Fatalf("silent client got %+v, want the commit of %s (and no request)", m, req.ID)
	}
	if got := latestStep(t, ar); got != 33 {
		t.Fatalf("latest step %d, want 33", got)
	}
}

// countingTrainer is the agent's child: it connects to argv[1] (once
// the socket is there), says hello with no rank and answers each
// checkpoint request at the next step (1, 2, ...), then exits on stop.
const countingTrainer = `
import json, os, socket, sys, time
deadline = time.time() + 10
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.01)
s.sendall(b'{"type":"hello","pid":%d}\n' % os.getpid())
step = 0
for line in s.makefile("rb"):
    m = json.loads(line)
    if m["type"] == "checkpoint":
        step += 1
        open(os.path.join(m["dir"], "w"), "w").write(str(step))
        s.sendall(json.dumps({"type": "done", "id": m["id"], "step": step}).encode() + b"\n")
    if m["type"] == "stop":
        break
`

// TestAgent_SilentClientBesideChild (issue 36, review; the end-to-end
// TestHostile_SilentClientHoldsNoCheckpoint until #49): under `spotagent
// run`, a client connects beside the agent's child, says hello with no
// rank and never answers. It is left out, said once with why; periodic
// checkpoints commit beside it and the shutdown checkpoint commits as if
// it were not there, none missing its deadline; it gets its welcome and
// never a request. One message per event: the child's start and each
// connection are logged once.
func TestAgent_SilentClientBesideChild(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatalf("this test runs a trainer under /usr/bin/python3: %v", err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/usr/bin/python3", "-c", countingTrainer, c.Server.Path}
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 300 * time.Millisecond})
		c.TermGrace = 30 * time.Second // a request held by the silent client would miss nothing sooner
		c.Log = zap.New(core)
	})
	testutil.WaitFor(t, "the child's hello", func() bool { return logs.FilterMessage("trainer connected").Len() == 1 })
	silent := trainertest.Dial(t, ar.cfg.Server.Path)
	silent.Send(map[string]any{"type": "hello", "pid": os.Getpid()})
	silent.Expect(protocol.TypeWelcome)
	testutil.WaitFor(t, "the silent client left out", func() bool { return logs.FilterMessage(trainers.LeftOutMsg).Len() > 0 })
	left := logs.FilterMessage(trainers.LeftOutMsg).All()
	if f := left[0].ContextMap(); len(left) != 1 || !strings.Contains(f["why"].(string), "single-process") || f["peer_uid"] != int64(os.Geteuid()) {
		t.Fatalf("left out: %+v, want one line, why the single-process rule, its peer_uid", left)
	}
	// Periodic checkpoints commit beside it.
	before := logs.FilterMessage("checkpoint committed").Len()
	testutil.WaitFor(t, "2 periodic commits beside the silent client", func() bool {
		return logs.FilterMessage("checkpoint committed").Len() >= before+2
	})

	ar.sigs <- syscall.SIGTERM
	if code := ar.wait(t); code != 0 && code != protocol.ExitInterrupted {
		t.Fatalf("exit code %d, want 0 or %d", code, protocol.ExitInterrupted)
	}
	done := logs.FilterMessage("interruption checkpoint committed: stopping the trainer").All()
	if len(done) != 1 {
		t.Fatalf("%d interruption commits, want 1", len(done))
	}
	if got, want := latestStep(t, ar), done[0].ContextMap()["step"]; got != want {
		t.Fatalf("latest step %d, want the shutdown checkpoint's %v", got, want)
	}
	if n := logs.FilterMessage("trainer missed the checkpoint deadline").Len(); n != 0 {
		t.Fatalf("%d requests missed their deadline, want none", n)
	}
	for m := range silent.Msgs() {
		if m.Type == protocol.TypeCheckpoint {
			t.Fatalf("the silent client got a request: %+v", m)
		}
	}
	for msg, want := range map[string]int{"trainer started": 1, "child started": 0, "trainer connected": 1, "connection accepted": 0} {
		if n := logs.FilterMessage(msg).Len(); n != want {
			t.Errorf("%d %q lines, want %d", n, msg, want)
		}
	}
}
