package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// The job of the peer tier's test: 2 nodes × 2 ranks. Every rank saves
// replica-<r>.bin, the same bytes on every rank (data-parallel weights and
// optimizer state), and shard-<r>.bin, its own.
const (
	peerReplicaBytes = 2 << 20
	peerShardBytes   = 1 << 20
)

func peerRankFiles(step int64, r int) map[string][]byte {
	return map[string][]byte{
		fmt.Sprintf("replica-%d.bin", r): bytes.Repeat([]byte(fmt.Sprintf("weights@%07d\n", step)), peerReplicaBytes/16),
		fmt.Sprintf("shard-%d.bin", r):   bytes.Repeat([]byte(fmt.Sprintf("r%dshard@%07d\n", r, step)), peerShardBytes/16),
	}
}

// peerSidecar starts node k's sidecar agent with the peer tier on, its
// checkpoint directory ckpt.
func peerSidecar(t *testing.T, env []string, uri, dir, ckpt string, k int, interval string, extra ...string) *proc {
	t.Helper()
	return start(t, env, append([]string{"sidecar", "--store", uri, "--run-id", "it", "--checkpoint-dir", ckpt,
		"--socket", filepath.Join(dir, "n"+strconv.Itoa(k)+".sock"), "--interval", interval, "--cloud", "none",
		"--log-format", "json", "--node-rank", strconv.Itoa(k),
		"--peer-restore", "--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1"}, extra...)...)
}

// TestDistributed_RestoreFromPeerReplica (#38 item 2): a job of two real
// agents (sidecars, --peer-restore --replicas 1, each its own checkpoint
// directory; the ranks played over the real protocol) commits a
// checkpoint, and node 0 keeps a copy of node 1's part; both machines are
// lost (SIGKILL). Node 0 comes back on its machine, node 1 on an empty
// one. Node 1 restores its part over real TCP from node 0, reading no
// data byte from the store (every request to the store is seen at a proxy
// in front of it). Both nodes resume the committed step with exactly the
// bytes saved, and the journal, `history` and `report` say where node 1's
// bytes came from. The peer tier's other end-to-end tests (without
// replicas, the wait for a peer still starting, forged peer and replica
// copies) were cut in #49: the agent's simulation runs the real peer tier
// (pkg/supervisor/internal/agentsim, peers_test.go), and
// pkg/checkpoint/peertier's tests each case.
func TestDistributed_RestoreFromPeerReplica(t *testing.T) {
	parallel(t)
	extra := []string{"--replicas", "1"}
	fs := newFaultStores(t, "peer")
	reads := fs.recordDataReads(".json")
	env := append(fs.env, "AWS_EC2_METADATA_DISABLED=true")
	const world, perNode = 4, 2
	dir := testutil.ShortDir(t)
	ckpt := []string{filepath.Join(dir, "n0"), filepath.Join(dir, "n1")}

	var agents []*proc
	for k := range 2 {
		agents = append(agents, peerSidecar(t, env, fs.uri, dir, ckpt[k], k, "300ms", extra...))
	}
	var ranks []*trainertest.Trainer
	for r := range world {
		ranks = append(ranks, dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r/perNode)+".sock"), r, world, perNode))
	}
	const step = 10
	saveJobStepFiles(t, ranks, step, func(r int) map[string][]byte { return peerRankFiles(step, r) })
	for r, tr := range ranks {
		if _, ok := tr.Next("committed", time.Minute); !ok {
			t.Fatalf("rank %d: step %d not committed", r, step)
		}
	}
	for _, a := range agents {
		a.waitEntry("kept a local copy of the committed checkpoint", time.Minute, nil)
		a.waitEntry("kept a copy of another node's part of the committed checkpoint", time.Minute, nil)
	}
	// Both machines lost at once: no notice, no goodbye.
	for _, a := range agents {
		a.signal(syscall.SIGKILL)
		a.wait(time.Minute)
	}
	for _, r := range ranks {
		r.Close()
	}

	// Node 0 back on its machine: its copy is served once its record says so.
	n0 := peerSidecar(t, env, fs.uri, dir, ckpt[0], 0, "1h", extra...)
	n0.waitEntry("peer tier: serving this node's local copies", time.Minute, func(e logEntry) bool {
		h, _ := e["holds"].([]any)
		return len(h) == 1
	})
	r0 := n0.waitEntry("restored checkpoint", time.Minute, nil)
	if r0.str("from") != "local" || r0.num("store_bytes") != 0 {
		t.Fatalf("node 0 restored from %q with %d bytes from the store, want local and 0", r0.str("from"), r0.num("store_bytes"))
	}
	reads.start()

	// Node 1 on an empty machine.
	n1 := peerSidecar(t, env, fs.uri, dir, filepath.Join(dir, "n1-new"), 1, "1h", extra...)
	r1 := n1.waitEntry("restored checkpoint", time.Minute, nil)
	// Everything from node 0: its replica files, and node 1's own shards
	// from its copy of node 1's part.
	peerBytes, storeBytes, from, storeKeys := int64(2*peerReplicaBytes+2*peerShardBytes), int64(0), "peer", []string(nil)
	if got := r1.num("peer_bytes"); got != peerBytes {
		t.Errorf("node 1: %d bytes from its peer, want %d", got, peerBytes)
	}
	if got := r1.num("store_bytes"); got != storeBytes {
		t.Errorf("node 1: %d bytes from the store, want %d", got, storeBytes)
	}
	if got := r1.str("from"); got != from {
		t.Errorf("node 1 restored from %q, want %s", got, from)
	}
	got := reads.read()
	if !slices.Equal(got, storeKeys) {
		t.Errorf("node 1 read the data objects %v from the store, want only %v", got, storeKeys)
	}

	// Both nodes' ranks resume the committed step with the bytes saved.
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
	// The journal is written beside the loop (Session.JournalAsync): the
	// restore's record lands after the trainers are welcomed.
	var n1Restore *journal.RestoreEntry
	testutil.WaitWithin(t, "node 1's restore in the journal", time.Minute, func() bool {
		j, err := journal.Read(t.Context(), fs.direct, "it")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range j.Restores {
			if r.Node == "node-1" {
				n1Restore = &r
				return true
			}
		}
		return false
	})
	if r := n1Restore; r.From[checkpoint.FromPeer] != peerBytes || r.Sources() != from {
		t.Errorf("journal: node 1's restore from %v, want %d bytes from peer (%s)", r.From, peerBytes, from)
	}
	if out := runSpotagentTool(t, env, "history", "--store", fs.uri); !strings.Contains(out, " "+from+" ") {
		t.Errorf("history does not say node 1's restore came from %s:\n%s", from, out)
	}
	if out := runSpotagentTool(t, env, "report", "--store", fs.uri); !strings.Contains(out, "from peer") {
		t.Errorf("report does not say bytes came from peer:\n%s", out)
	}
}
