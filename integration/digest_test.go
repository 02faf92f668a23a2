package integration

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
)

// forgeTree rewrites every regular file below dir whose path passes keep
// with other bytes of the same size and CRC32C (#46), and returns how many.
func forgeTree(t *testing.T, dir string, keep func(rel string) bool) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !keep(filepath.ToSlash(rel)) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) < 4 {
			return err
		}
		fake, err := forge.Like(b, []byte("EVIL-WEIGHTS-FROM-MITM"))
		if err != nil {
			return err
		}
		n++
		return os.WriteFile(p, fake, 0o600) // in place: a hard link's other name sees it too
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDigest_ForgedPeerAndReplicaNeverUsed (#46): a job of two real agents
// (sidecars, --peer-restore --replicas 1; the ranks played over the real
// protocol) commits a checkpoint, and node 0 keeps a replica of node 1's
// part. Both machines are lost. On node 0's disk, one of its own kept files
// and every file of its replica of node 1's part are rewritten with other
// bytes of the same size and CRC32C. Node 0 comes back and refuses its
// forged local copy; node 1 comes back on an empty machine, asks node 0,
// refuses its forged copy and asks node 0 no more: every rank of both nodes
// resumes the committed step with exactly the bytes saved.
func TestDigest_ForgedPeerAndReplicaNeverUsed(t *testing.T) {
	parallel(t)
	fstores := newFaultStores(t, "s3", "digest")
	env := append(fstores.env, "AWS_EC2_METADATA_DISABLED=true")
	const world, perNode = 4, 2
	dir := testutil.ShortDir(t)
	ckpt := []string{filepath.Join(dir, "n0"), filepath.Join(dir, "n1")}
	extra := []string{"--replicas", "1"}

	var agents []*proc
	for k := range 2 {
		agents = append(agents, peerSidecar(t, env, fstores.uri, dir, ckpt[k], k, "300ms", extra...))
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
	}
	agents[0].waitEntry("kept a copy of another node's part of the committed checkpoint", time.Minute, nil)
	for _, a := range agents {
		a.signal(syscall.SIGKILL)
		a.wait(time.Minute)
	}
	for _, r := range ranks {
		r.Close()
	}
	// Node 0's replica of node 1's part (<step>-<id>+node-1/), and its own
	// shard-0.bin.
	forgedReplica := forgeTree(t, ckpt[0], func(rel string) bool { return strings.Contains(rel, "committed/") && strings.Contains(rel, "+node-1/") })
	forgedOwn := forgeTree(t, ckpt[0], func(rel string) bool {
		return strings.Contains(rel, "committed/") && !strings.Contains(rel, "+") && strings.HasSuffix(rel, "/shard-0.bin")
	})
	if forgedReplica != 4 || forgedOwn != 1 {
		t.Fatalf("forged %d replica files and %d of node 0's own, want 4 and 1", forgedReplica, forgedOwn)
	}

	n0 := peerSidecar(t, env, fstores.uri, dir, ckpt[0], 0, "1h", extra...)
	n0.waitEntry("local tier: dropped a copy that failed verification", time.Minute, nil)
	r0 := n0.waitEntry("restored checkpoint", time.Minute, nil)
	if got := r0.num("store_bytes"); got != peerShardBytes {
		t.Errorf("node 0: %d bytes from the store, want %d (its forged shard-0.bin alone)", got, peerShardBytes)
	}
	n0.waitEntry("peer tier: serving this node's local copies", time.Minute, func(e logEntry) bool {
		h, _ := e["holds"].([]any)
		return len(h) == 1
	})

	n1 := peerSidecar(t, env, fstores.uri, dir, filepath.Join(dir, "n1-new"), 1, "1h", extra...)
	n1.waitEntry("peer tier: a peer's copy failed verification: not asking that peer again", time.Minute, nil)
	r1 := n1.waitEntry("restored checkpoint", time.Minute, nil)
	if got := r1.num("store_bytes"); got < peerShardBytes {
		t.Errorf("node 1: %d bytes from the store, want at least one forged shard's %d", got, peerShardBytes)
	}

	// Every rank resumes the committed step with the bytes saved.
	for r := range world {
		rc := dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r/perNode)+".sock"), r, world, perNode)
		res := rc.Welcome().Resume
		if res == nil || res.Step != step {
			t.Fatalf("rank %d: resume %+v, want step %d", r, res, step)
		}
		for name, want := range peerRankFiles(step, r) {
			if b, err := os.ReadFile(filepath.Join(res.Dir, name)); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("rank %d: %s in the resume directory: %v (the committed bytes: %v)", r, name, err, bytes.Equal(b, want))
			}
		}
	}
}
