package nodemode

import (
	"context"
	"encoding/json"
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
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// nodeRunning is a node agent (Run) serving until the test ends.
type nodeRunning struct {
	sock   string
	src    *noticetest.Source
	sigs   chan os.Signal
	done   chan error
	logs   *observer.ObservedLogs
	idents chan string // each accepted connection takes its PeerIdentity from here
}

// startNode runs a node agent with file stores under a temp dir. open,
// when set, runs before each run's store is opened (to stall a run).
// Every connection's peer identity is fed by the test through dialAs.
func startNode(t *testing.T, open func(uri string), mutate ...func(*Config)) *nodeRunning {
	t.Helper()
	dir := testutil.ShortDir(t)
	core, logs := observer.New(zap.InfoLevel)
	n := &nodeRunning{sock: filepath.Join(dir, "node.sock"), src: noticetest.New(4),
		sigs: make(chan os.Signal, 2), done: make(chan error, 1), logs: logs, idents: make(chan string)}
	cfg := Config{
		StorePrefix: "file://" + filepath.Join(dir, "runs"), CheckpointRoot: filepath.Join(dir, "ckpt"),
		Source: n.src, Log: zap.New(core),
		Server: protocol.ServerConfig{Path: n.sock, Identify: func(int, int) string {
			select {
			case id := <-n.idents:
				return id
			case <-time.After(testutil.Wait):
				return "uid:unfed"
			}
		}},
		OpenStore: func(ctx context.Context, uri string) (cloud.Store, error) {
			if open != nil {
				open(uri)
			}
			return file.New(strings.TrimPrefix(uri, "file://"))
		},
		NewScheduler: func() *schedule.Scheduler {
			return schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Hour})
		},
		Run: supervisor.Config{TermGrace: 5 * time.Second, Margin: time.Second},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	go func() { n.done <- Run(context.Background(), cfg, n.sigs) }()
	t.Cleanup(func() {
		n.sigs <- syscall.SIGTERM
		select {
		case err := <-n.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * testutil.Wait):
			t.Errorf("Run did not return after SIGTERM")
		}
	})
	return n
}

// dialAs connects as a peer with the given identity.
func (n *nodeRunning) dialAs(t *testing.T, ident string) *trainertest.Trainer {
	t.Helper()
	tr := trainertest.Dial(t, n.sock)
	select {
	case n.idents <- ident:
	case <-time.After(testutil.Wait):
		t.Fatal("the node did not accept the connection")
	}
	return tr
}

// helloRun says hello as the one rank of run's world of 1.
func helloRun(tr *trainertest.Trainer, run string) {
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": 0, "world_size": 1, "run_id": run})
}

// jobPods connects pods a and b, each saying hello as the one rank of its
// node of run "job" (two nodes), and returns them with their welcomes.
func (n *nodeRunning) jobPods(t *testing.T) ([]*trainertest.Trainer, []protocol.Message) {
	t.Helper()
	pods := []*trainertest.Trainer{n.dialAs(t, "pod:a"), n.dialAs(t, "pod:b")}
	var welcomes []protocol.Message
	for k, tr := range pods {
		tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "job", "rank": k, "world_size": 2,
			"local_rank": 0, "local_world_size": 1, "node_rank": k, "nodes": 2})
		welcomes = append(welcomes, tr.Expect(protocol.TypeWelcome))
	}
	return pods, welcomes
}

// stopJob stops the node (SIGTERM): each pod of jobPods saves rank-K.pt
// for the shutdown checkpoint at step 40, and both see it committed. It
// returns the checkpoint's id.
func (n *nodeRunning) stopJob(t *testing.T, pods []*trainertest.Trainer) string {
	t.Helper()
	n.sigs <- syscall.SIGTERM
	var id string
	for k, tr := range pods {
		req := tr.Expect(protocol.TypeCheckpoint)
		if k == 1 && req.ID != id {
			// Each node asked on its own: the ranks' agreement picks one, and
			// the other node joins it.
			tr.Send(map[string]any{"type": "join", "id": id, "reason": req.Reason, "deadline": req.Deadline})
			req = tr.Expect(protocol.TypeCheckpoint)
		}
		id = req.ID
		testutil.WriteFile(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d.pt", k)), fmt.Sprint(k))
		tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 40})
	}
	for _, tr := range pods {
		tr.Expect(protocol.TypeCommitted)
	}
	return id
}

// TestNode_StalledRunDoesNotBlock (issue 13 item 7): one run's loop does
// not read its queue (a long restore); its trainer floods it with status
// requests. Another run's trainer is still welcomed and gets the
// machine's notice, and the flooding connection is closed.
func TestNode_StalledRunDoesNotBlock(t *testing.T) {
	release := make(chan struct{})
	released := false
	n := startNode(t, func(uri string) {
		if strings.HasSuffix(uri, "/stalled") {
			<-release
		}
	})
	t.Cleanup(func() { // before the node's cleanup stops it
		if !released {
			close(release)
		}
	})
	flood := n.dialAs(t, "pod:a")
	helloRun(flood, "stalled")
	for range 2 * protocol.EventBuffer {
		// Once the node closes the connection, sends fail: that is the point.
		flood.Conn().Send(context.Background(), protocol.Message{Type: protocol.TypeStatus})
	}
	m := flood.Expect(protocol.TypeError)
	if !strings.Contains(m.Error, "is busy") {
		t.Fatalf("error %q, want the run's queue full", m.Error)
	}
	flood.ExpectClosed()
	if logs := n.logs.FilterMessage("node: run's queue is full: message dropped and its connection closed").All(); len(logs) != 1 || logs[0].ContextMap()["run"] != "stalled" {
		t.Errorf("logs %+v, want one drop for run stalled", logs)
	}

	other := n.dialAs(t, "pod:b")
	helloRun(other, "other")
	if w := other.Expect(protocol.TypeWelcome); w.RunID != "other" {
		t.Fatalf("welcome %+v, want run other", w)
	}
	n.src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1",
		Deadline: time.Now().Add(time.Minute), Detected: time.Now()}
	if req := other.Expect(protocol.TypeCheckpoint); req.Reason != protocol.ReasonInterruption {
		t.Fatalf("request %+v, want an interruption checkpoint", req)
	}

	// Once the stalled run gets going, it serves new trainers: the
	// flooder's disconnect reached it without holding anyone up.
	close(release)
	released = true
	if w := n.helloUntilWelcome(t, "pod:a", "stalled"); w.RunID != "stalled" {
		t.Fatalf("welcome %+v, want run stalled", w)
	}
}

// helloUntilWelcome says hello as ident until the node welcomes it (as
// the client library does, reconnecting in the background), returning
// the welcome. Refusals must be error replies.
func (n *nodeRunning) helloUntilWelcome(t *testing.T, ident, run string) protocol.Message {
	t.Helper()
	deadline := time.Now().Add(testutil.Wait)
	for i := 0; ; i++ {
		tr := n.dialAs(t, ident)
		helloRun(tr, run)
		select {
		case m, ok := <-tr.Msgs():
			if ok && m.Type == protocol.TypeWelcome {
				return m
			}
			if !ok || m.Type != protocol.TypeError {
				t.Fatalf("attempt %d: %+v (open %v), want welcome or error", i, m, ok)
			}
		case <-time.After(testutil.Wait):
			t.Fatalf("attempt %d: no reply", i)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never got run %s", ident, run)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, bounded by deadline
	}
}

// TestNode_RunBoundToPeer (issue 13 item 8): while a run has connections
// from one pod, another pod's hello for that run id is refused; once they
// are gone, a new pod (the Job's next one) takes it.
func TestNode_RunBoundToPeer(t *testing.T) {
	n := startNode(t, nil)
	a1 := n.dialAs(t, "pod:a")
	helloRun(a1, "teamB")
	a1.Expect(protocol.TypeWelcome)

	b := n.dialAs(t, "pod:b")
	helloRun(b, "teamB")
	if m := b.Expect(protocol.TypeError); !strings.Contains(m.Error, "in use by another pod or user") {
		t.Fatalf("error %q, want the run id in use", m.Error)
	}
	b.ExpectClosed()
	logs := n.logs.FilterMessage("node: hello refused: run id in use by another peer").All()
	if len(logs) != 1 || logs[0].ContextMap()["peer"] != "pod:b" || logs[0].ContextMap()["owner"] != "pod:a" {
		t.Fatalf("logs %+v, want one refusal of pod:b, owner pod:a", logs)
	}

	// Another rank of the same pod joins the run.
	a2 := n.dialAs(t, "pod:a")
	helloRun(a2, "teamB")
	a2.Expect(protocol.TypeWelcome)
	// Other run ids are anyone's.
	bOwn := n.dialAs(t, "pod:b")
	helloRun(bOwn, "teamC")
	bOwn.Expect(protocol.TypeWelcome)

	a1.Close()
	a2.Close()
	// The next pod of the Job: refused while the old pod's disconnects are
	// in flight, welcomed once they are through.
	n.helloUntilWelcome(t, "pod:b", "teamB")
}

// TestNode_PartFieldsDoNotTakeARun (issue 36 item 2): a hello naming a
// live run of another pod, with node_rank/nodes/world_size added, used to
// make a run of its own (the key held the part) and get the victim's
// checkpoint restored. A run belongs to one owner across all its parts:
// it is refused, as is a whole-run hello for a job another pod runs as
// parts.
func TestNode_PartFieldsDoNotTakeARun(t *testing.T) {
	n := startNode(t, nil)
	victim := n.dialAs(t, "pod:a")
	helloRun(victim, "victim")
	victim.Expect(protocol.TypeWelcome)
	thief := n.dialAs(t, "pod:b")
	thief.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "victim", "rank": 1, "world_size": 2,
		"local_rank": 0, "local_world_size": 1, "node_rank": 1, "nodes": 2})
	if m := thief.Expect(protocol.TypeError); !strings.Contains(m.Error, "in use by another pod or user") {
		t.Fatalf("error %q, want the run id in use", m.Error)
	}
	thief.ExpectClosed()

	job := n.dialAs(t, "pod:a")
	job.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "job", "rank": 0, "world_size": 2,
		"local_rank": 0, "local_world_size": 1, "node_rank": 0, "nodes": 2})
	job.Expect(protocol.TypeWelcome)
	whole := n.dialAs(t, "pod:b")
	helloRun(whole, "job")
	if m := whole.Expect(protocol.TypeError); !strings.Contains(m.Error, "in use by another pod or user") {
		t.Fatalf("error %q, want the run id in use", m.Error)
	}
	whole.ExpectClosed()
	if got := len(n.logs.FilterMessage("node: new run").All()); got != 2 {
		t.Fatalf("%d runs started, want 2 (the victim's and the job's part)", got)
	}
}

// Issue 24.4: two pods of one two-node job scheduled on one machine are
// two runs of the node agent (run id and node rank), each with its own
// directory, and their checkpoint commits as one job checkpoint. Before,
// the second pod's hello was refused as "in use by another pod".
func TestNode_TwoPodsOfOneJob(t *testing.T) {
	n := startNode(t, nil)
	pods, welcomes := n.jobPods(t)
	if welcomes[0].CheckpointDir == welcomes[1].CheckpointDir {
		t.Fatalf("both pods got checkpoint dir %s", welcomes[0].CheckpointDir)
	}
	n.stopJob(t, pods) // every run takes a shutdown checkpoint
	st, err := file.New(filepath.Join(filepath.Dir(n.sock), "runs", "job"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := checkpoint.ReadLatest(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.ReadManifest(context.Background(), st, l.Manifest)
	if err != nil || len(m.Parts) != 2 || m.Step != 40 {
		t.Fatalf("job manifest %+v, %v: want 2 parts at step 40", m, err)
	}
}

// TestNode_PlantedSymlinkRefused: a pod that can write the hostPath plants
// a symlink where a run's directory (or a multi-node part's) will be. The
// run is refused and nothing is created through the link.
func TestNode_PlantedSymlinkRefused(t *testing.T) {
	n := startNode(t, nil)
	root := filepath.Join(filepath.Dir(n.sock), "ckpt")
	outside := filepath.Join(filepath.Dir(n.sock), "outside")
	for _, d := range []string{outside, filepath.Join(root, "job")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, link := range []string{filepath.Join(root, "evil"), filepath.Join(root, "job", "node-1")} {
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
	}
	single := n.dialAs(t, "pod:a")
	helloRun(single, "evil")
	single.ExpectClosed()
	part := n.dialAs(t, "pod:b")
	part.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "job", "rank": 1, "world_size": 2,
		"local_rank": 0, "local_world_size": 1, "node_rank": 1, "nodes": 2})
	part.ExpectClosed()
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
		t.Fatalf("created through the planted link: %v, %v", ents, err)
	}
	if got := n.logs.FilterMessageSnippet("symlink").Len() + n.logs.FilterFieldKey("error").Len(); got == 0 {
		t.Fatal("no refusal logged")
	}
}

// TestNode_PanicFailsOneRun (issue 36 item 5): a panic in one run's work
// (here its store's opening) fails that run, logged with its stack; the
// node agent and its other runs go on. Before, it took every run on the
// machine down.
func TestNode_PanicFailsOneRun(t *testing.T) {
	n := startNode(t, func(uri string) {
		if strings.HasSuffix(uri, "/boom") {
			_ = make([]byte, -len(uri)) // a makeslice panic, as world_size 2^62 caused
		}
	})
	boom := n.dialAs(t, "pod:a")
	helloRun(boom, "boom")
	if m := boom.Expect(protocol.TypeError); !strings.Contains(m.Error, "run could not start: internal error (panic)") {
		t.Fatalf("error %q, want the run failed by its panic", m.Error)
	}
	logs := n.logs.FilterMessage("background work panicked: it fails, the agent goes on").All()
	if len(logs) != 1 || !strings.Contains(logs[0].ContextMap()["stack"].(string), "node.go") {
		t.Fatalf("logs %+v, want one panic logged with its stack", logs)
	}
	n.helloUntilWelcome(t, "pod:b", "fine")
}

// TestNode_StatusListsRuns (#41 item 4): a status request from a
// connection that named no run (spotagent status) gets every run the node
// serves, each with its own status: its trainers, its next checkpoint.
func TestNode_StatusListsRuns(t *testing.T) {
	n := startNode(t, nil)
	for _, run := range []string{"teamB", "teamA"} {
		tr := n.dialAs(t, "pod:"+run)
		helloRun(tr, run)
		tr.Expect(protocol.TypeWelcome)
	}
	ask := func() supervisor.NodeStatus {
		cli := n.dialAs(t, "uid:0")
		cli.Send(map[string]any{"type": "status"})
		m := cli.Expect(protocol.TypeStatus)
		var st supervisor.NodeStatus
		if err := json.Unmarshal(m.Status, &st); err != nil {
			t.Fatalf("node status %s: %v", m.Status, err)
		}
		return st
	}
	var st supervisor.NodeStatus
	testutil.WaitFor(t, "both runs' trainers in the node's status", func() bool {
		st = ask()
		return len(st.Runs) == 2 && st.Runs[0].Status != nil && st.Runs[0].Status.Trainers == 1 &&
			st.Runs[1].Status != nil && st.Runs[1].Status.Trainers == 1
	})
	if !st.Node || !strings.HasPrefix(st.StorePrefix, "file://") {
		t.Fatalf("node status %+v", st)
	}
	for i, want := range []string{"teamA", "teamB"} {
		r := st.Runs[i]
		if r.Key != want || r.Status.RunID != want || !strings.HasSuffix(r.Status.Store, "/"+want) ||
			r.Status.NextCheckpoint == nil || r.Status.Interval != "1h0m0s" {
			t.Fatalf("run %d: %+v %+v, want %s with its store and next checkpoint", i, r, r.Status, want)
		}
	}
}

// TestNode_DotRunIDsRefused (#37 item 4): run ids of dots only, hidden ones
// and ones ending in a dot name no plain directory or store prefix: refused
// with the rule spelled out, nothing created. A dot inside is fine.
func TestNode_DotRunIDsRefused(t *testing.T) {
	n := startNode(t, nil)
	dir := filepath.Dir(n.sock)
	for _, id := range []string{"...", ".hidden", "x.", ".", ".."} {
		tr := n.dialAs(t, "pod:a")
		helloRun(tr, id)
		m := tr.Expect(protocol.TypeError)
		if !strings.Contains(m.Error, "refused") || !strings.Contains(m.Error, "neither beginning nor ending with '.'") {
			t.Errorf("run id %q: error %q, want a refusal that says a run id may neither begin nor end with '.'", id, m.Error)
		}
		tr.ExpectClosed()
	}
	for _, sub := range []string{"ckpt", "runs"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			t.Errorf("%s/%s created for a refused run id", sub, e.Name())
		}
	}
	ok := n.dialAs(t, "pod:a")
	helloRun(ok, "exp.42")
	ok.Expect(protocol.TypeWelcome)
}
