package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// Issue #37 in node mode: one `spotagent node` per machine hosts each node
// of a multi-node job that connects. The node agents heartbeat through one
// UDP socket each (--peer-listen), every hosted run a member of its own
// job's ring; a silent neighbour makes the surviving node agent create
// peer-lost in that run's directory, and the pod's trainer script (the
// multi-node manifest's, with SPOTAGENT_PEER_LOST) ends torchrun and exits
// 75.

// TestNodeMode_SilentNodeEndsJob: two node agents (two machines), each
// hosting one node of a 2 × 2-rank job whose trainer container is the
// manifest's script as PID 1 of a PID namespace. Node 1's agent and its
// trainer's whole tree are SIGSTOPped (no RST): node 0's trainer container
// exits 75 well before the ranks' 60 s process-group timeout, and node 0's
// agent serves on.
func TestNodeMode_SilentNodeEndsJob(t *testing.T) {
	parallelTorchBounded(t)
	requirePython(t, true)
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace (unshare --pid) needs root")
	}
	c := manifestTrainer(t, "deploy/kubernetes/multinode-job.yaml")
	dir := testutil.ShortDir(t)
	prefix := "file://" + filepath.Join(dir, "store") + "/"
	port := freePort(t)
	const run = "nodejob"
	var agents []*proc
	var trainers []*pid1Trainer
	for k := 0; k < ddpNodes; k++ {
		root := filepath.Join(dir, fmt.Sprintf("root%d", k)) // the machine's /var/lib/spotagent
		sock := filepath.Join(dir, fmt.Sprintf("s%d", k), "agent.sock")
		if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
			t.Fatal(err)
		}
		a := start(t, nil, "node", "--store-prefix", prefix, "--checkpoint-root", root, "--socket", sock,
			"--cloud", "none", "--log-format", "json", "--interval", "1h", "--term-grace", "50s", "--kill-after", "5s",
			"--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1")
		a.waitEntry("node agent: heartbeats of hosted multi-node runs on one UDP socket", time.Minute, nil)
		waitFile(t, sock, time.Minute)
		agents = append(agents, a)
		lost := filepath.Join(root, run, "node-"+strconv.Itoa(k), "peer-lost")
		trainers = append(trainers, startPID1Trainer(t, c, k, port, sock, dir,
			append(ddpEnv(50), "SPOTAGENT_RUN_ID="+run, "SPOTAGENT_PEER_LOST="+lost)))
	}
	trainers[1].p.waitLine(`rank 2 step 30\b`, 3*time.Minute)
	for _, a := range agents {
		a.waitEntry("liveness: a neighbour heard", time.Minute, nil)
	}
	took := stopNodeOne(t, trainers, agents[1])
	agents[0].waitEntry("a neighbour node's agent is silent (its machine stopped answering): told the trainer container to end its ranks",
		time.Second, func(e logEntry) bool { return e.num("peer_node") == 1 && e.str("run") == run+"/node-0" })
	if took > 50*time.Second {
		t.Errorf("node 0's trainer container took %s, want well under the ranks' 60 s process-group timeout", took)
	}
	select {
	case <-agents[0].done:
		t.Fatal("node 0's agent exited: a node agent serves every run of its machine, not just the one that lost a peer")
	default:
	}
}
