package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
)

// TestDistributed_RestoreWaitsForPeer (#38 item 2): a whole-job restart
// in which the replacement starts first. A job of two real agents
// commits a checkpoint; both machines are lost (SIGKILL), their peer
// records left naming the ports of that session. Node 1 comes back on an
// empty machine before node 0's agent: node 0's record holds the
// checkpoint but its address refuses the connection, so node 1 waits for
// node 0's agent (it logs so) instead of reading every file from the
// store. Node 0 is started only then, on its machine, with a new session
// and port; node 1 takes its replica files from it and reads from the
// store only its own shards (every request to the store is seen at a
// proxy in front of it). Both nodes resume the committed step.
func TestDistributed_RestoreWaitsForPeer(t *testing.T) {
	parallel(t)
	fs := newFaultStores(t, "s3", "peerwait")
	reads := fs.recordDataReads(".json")
	env := append(fs.env, "AWS_EC2_METADATA_DISABLED=true")
	const world, perNode, step = 4, 2, 10
	dir := testutil.ShortDir(t)
	ckpt := []string{filepath.Join(dir, "n0"), filepath.Join(dir, "n1")}
	var agents []*proc
	for k := range 2 {
		agents = append(agents, peerSidecar(t, env, fs.uri, dir, ckpt[k], k, "300ms"))
	}
	var ranks []*trainertest.Trainer
	for r := range world {
		ranks = append(ranks, dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r/perNode)+".sock"), r, world, perNode))
	}
	saveJobStepFiles(t, ranks, step, func(r int) map[string][]byte { return peerRankFiles(step, r) })
	for r, tr := range ranks {
		if _, ok := tr.Next("committed", time.Minute); !ok {
			t.Fatalf("rank %d: step %d not committed", r, step)
		}
	}
	for _, a := range agents {
		a.waitEntry("kept a local copy of the committed checkpoint", time.Minute, nil)
	}
	for _, a := range agents { // both machines lost at once
		a.signal(syscall.SIGKILL)
		a.wait(time.Minute)
	}
	for _, r := range ranks {
		r.Close()
	}
	reads.start()

	// Node 1 first, on an empty machine: node 0's record names a dead port.
	n1 := peerSidecar(t, env, fs.uri, dir, filepath.Join(dir, "n1-new"), 1, "1h", "--peer-wait", "2m")
	w := n1.waitEntry("peer tier: a peer holding the checkpoint does not answer: waiting for its agent to start", time.Minute, nil)
	if w.str("node") != "node-0" || w.num("bound_s") < 100 {
		t.Fatalf("node 1 waits for %q, bound %d s; want node-0 and --peer-wait's 120 s", w.str("node"), w.num("bound_s"))
	}
	if n1.has(`"msg":"restored checkpoint"`) {
		t.Fatal("node 1 restored before node 0's agent started")
	}
	// Node 0's agent starts only now, on its machine.
	n0 := peerSidecar(t, env, fs.uri, dir, ckpt[0], 0, "1h")
	r1 := n1.waitEntry("restored checkpoint", time.Minute, nil)
	e := n1.waitEntry("peer tier: wait for a peer ended", time.Minute, nil)
	if e.str("outcome") != "new session" {
		t.Errorf("node 1's wait ended with %q, want new session", e.str("outcome"))
	}
	t.Logf("node 1 waited %v s for node 0's agent to start and publish its record", e["waited_s"])
	if got, want := r1.num("peer_bytes"), int64(2*peerReplicaBytes); got != want {
		t.Errorf("node 1: %d bytes from its peer, want %d", got, want)
	}
	if got, want := r1.num("store_bytes"), int64(2*peerShardBytes); got != want {
		t.Errorf("node 1: %d bytes from the store, want %d (its own shards)", got, want)
	}
	if got := r1.str("from"); got != "peer+store" {
		t.Errorf("node 1 restored from %q, want peer+store", got)
	}
	r0 := n0.waitEntry("restored checkpoint", time.Minute, nil)
	if r0.str("from") != "local" || r0.num("store_bytes") != 0 {
		t.Errorf("node 0 restored from %q with %d bytes from the store, want local and 0", r0.str("from"), r0.num("store_bytes"))
	}
	got := reads.read()
	if want := []string{"shard-2.bin", "shard-3.bin"}; !slices.Equal(got, want) {
		t.Errorf("the data objects %v were read from the store, want only node 1's shards %v", got, want)
	}
	for r := range world {
		rc := dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r/perNode)+".sock"), r, world, perNode)
		res := rc.Welcome().Resume
		if res == nil || res.Step != step {
			t.Fatalf("rank %d: resume %+v, want step %d", r, res, step)
		}
		for name, want := range peerRankFiles(step, r) {
			if b, err := os.ReadFile(filepath.Join(res.Dir, name)); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("rank %d: %s in the resume directory: %v (content equal: %v)", r, name, err, bytes.Equal(b, want))
			}
		}
	}
}
