package peertier

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
)

// forgeFile rewrites the file at p in place with other bytes of the same
// size and CRC32C (#46).
func forgeFile(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := forge.Like(b, []byte("EVIL-WEIGHTS-FROM-MITM"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fake, 0o600); err != nil {
		t.Fatal(err)
	}
}

func fileOf(t *testing.T, m *checkpoint.Manifest, part, path string) checkpoint.File {
	t.Helper()
	for _, f := range m.Files {
		if f.Part == part && f.Path == path {
			return f
		}
	}
	t.Fatalf("no file %s of part %s", path, part)
	return checkpoint.File{}
}

// A peer serves copies of the same size and CRC32C as the committed ones
// but other bytes: restore refuses them by the digest, and node 1 resumes
// the committed bytes (r.restore checks them), none of them from the peer.
func TestForgedPeerCopyRefused(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	for _, f := range []string{"replica-0.bin", "replica-1.bin"} {
		forgeFile(t, r.keptPath(0, f))
	}
	r.serve(0, nil, 0)
	res := r.restore(1, 0)
	if got := res.From[checkpoint.FromPeer]; got != 0 {
		t.Fatalf("From[peer]=%d, want 0: every copy was forged", got)
	}
}

// A peer whose copy failed verification is not asked again by that
// restore's client: its next file comes from no peer (the store).
func TestForgedPeerNotAskedAgain(t *testing.T) {
	r := newRig(t)
	logs := r.observe()
	r.commit(0)
	forgeFile(t, r.keptPath(0, "replica-0.bin"))
	r.serve(0, nil, 0)
	cl := r.serve(1, nil, 0).Tier()
	f0 := fileOf(t, r.m, "node-1", "replica-2.bin") // node 0 serves its replica-0.bin, the same content
	rc, err := cl.Open(context.Background(), r.m, f0)
	if err != nil {
		t.Fatal(err)
	}
	err = checkpoint.CopyDigestVerified(io.Discard, rc, f0, nil)
	if !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("forged copy: %v, want ErrCorrupt", err)
	}
	rc.(checkpoint.Refusable).Refuse(err)
	rc.Close()
	said := logs.FilterMessage("peer tier: a peer's copy failed verification: not asking that peer again").All()
	if len(said) != 1 || said[0].ContextMap()["node"] != "node-0" {
		t.Fatalf("refusals logged: %v, want one naming node-0", said)
	}
	// node 0's replica-1.bin is genuine, but node 0 is not asked.
	if _, err := cl.Open(context.Background(), r.m, fileOf(t, r.m, "node-1", "replica-3.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("second file after a refused copy: %v, want fs.ErrNotExist (no peer asked)", err)
	}
	// A new restore's client asks it again (the peer may have been fixed).
	rc, err = r.nodes[1].peer.Tier().Open(context.Background(), r.m, fileOf(t, r.m, "node-1", "replica-3.bin"))
	if err != nil {
		t.Fatalf("a new client: %v", err)
	}
	rc.Close()
}

// A file whose entry records no digest (a CRC-only manifest) is never
// asked of a peer.
func TestPeerNotAskedWithoutDigest(t *testing.T) {
	r := newRig(t)
	r.commit(0)
	r.serve(0, nil, 0)
	cl := r.serve(1, nil, 0).Tier()
	f := fileOf(t, r.m, "node-1", "replica-2.bin")
	f.BLAKE3 = ""
	if _, err := cl.Open(context.Background(), r.m, f); !errors.Is(err, checkpoint.ErrNoDigest) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open without a digest: %v, want ErrNoDigest and fs.ErrNotExist", err)
	}
}

// Node 0's replica of node 1's part (--replicas 1) rewritten with the same
// size and CRC32C: a replacement of node 1 gets that file from the store,
// and resumes the committed bytes of every file.
func TestForgedReplicaRefused(t *testing.T) {
	r := newRig(t)
	r.commit(0, 1)
	p1 := r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err != nil {
		t.Fatal(err)
	}
	p1.Close() // node 1's machine is gone
	forgeFile(t, r.keptPartPath(0, "node-1", "shard-3.bin"))
	cl := NewClient(r.st, "run", "node-1", p0.token, 0, nil)
	res, err := restore.Checkpoint(context.Background(), r.st, t.TempDir(), restore.Options{Part: "node-1", Tiers: []checkpoint.Tier{cl}})
	if err != nil {
		t.Fatal(err)
	}
	for _, rank := range parts[1].Ranks {
		for f, b := range rankFiles(rank, 10) {
			if got, err := os.ReadFile(res.Dir + "/" + f); err != nil || string(got) != string(b) {
				t.Fatalf("%s: %v, or its content differs", f, err)
			}
		}
	}
	if got := res.From[checkpoint.FromStore]; got < shardBytes {
		t.Fatalf("From=%v: the forged shard-3.bin did not come from the store", res.From)
	}
}

// Replicating from a peer whose copy is forged (same size and CRC32C)
// keeps no replica of it.
func TestReplicaForgedCopyNotKept(t *testing.T) {
	r := newRig(t)
	r.commit(0, 1)
	forgeFile(t, r.keptPath(1, "shard-3.bin"))
	r.serve(1, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err == nil {
		t.Fatal("replicate: no error for a forged copy")
	}
	for _, f := range []string{"shard-2.bin", "shard-3.bin", "replica-2.bin"} {
		if _, err := os.Stat(r.keptPartPath(0, "node-1", f)); err == nil {
			t.Fatalf("%s of node 1 kept on node 0 after a forged copy", f)
		}
	}
}
