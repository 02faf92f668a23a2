package agentsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/internal/testutil/memnet"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// The machines' copies of a job (issue 49: the end-to-end
// TestDistributed_RestoreFromPeer, _RestoreWaitsForPeer and
// TestDigest_ForgedPeerAndReplicaNeverUsed were cut, these hold their
// guarantees; TestDistributed_RestoreFromPeerReplica stays, over real
// TCP), in the sessions of a job (parts_test.go). Each node keeps
// Config.LocalKeep committed checkpoints in its machine's local tier
// (its part; with --replicas 1 also a copy of another node's part) and,
// when the session draws the peer tier on (--peer-restore), serves them
// to the job's other agents over an in-memory network (memnet: node k at
// 10.0.0.<k+1>, the real peer tier's server and client over net.Pipe)
// and restores from theirs before the store. In some jobs the ranks also
// save data-parallel copies: dp/rank<r>.bin, the same bytes on every
// rank, which a node may restore from any other node that holds its own
// part. Before a later session, one node's machine may be new (its
// directory emptied: every copy it kept is gone), and the data files of
// one or every copy on the machines may be forged (other bytes of the
// same size and CRC32C, forge.Like), as a hostile local user or a bad
// disk could. What holds:
//
//   - a forged copy, the machine's own or a peer's, is never handed to a
//     rank: every resume's files are the bytes the ranks wrote (resumed,
//     agentsim_test.go), so the agent refused each forged file by the
//     manifest's digest and read the genuine one from elsewhere;
//   - a node on a new machine restores from its peers what they hold
//     intact: in a session with no store fault and the tiers on, no file
//     of its part of the newest complete checkpoint that another node's
//     machine holds with the bytes written (a replica of the part, or a
//     data-parallel copy of the same bytes in that node's own part) is
//     read from the store until the session's first commit or the host's
//     first event (a signal, notice, kill, loss or second copy: a node that
//     ends may cut a transfer) (peerRead),
//     unless a copy of that checkpoint was forged (one refused copy of a
//     file sends that file to the store, not to the next peer);
//   - the agents end by their bounds (parts_test.go) with a peer that is
//     gone, one still starting, or one whose copy is refused: a restore's
//     waits for peers (20 s in all) and stalls (10 s) are bounded.
//
// The counters (peerChecked) say the checks saw restores with bytes from
// a peer and resumes of a checkpoint with a forged copy on a machine.
// Drawn from a generator of their own (drawPeerShape); the seeds that
// found bugs before (prePeerSeeds) draw none, so that their schedules
// stay what they were.

// peerShape is what a job's session draws for its machines' copies.
type peerShape struct {
	keep     int       // Config.LocalKeep on every node
	on       bool      // the peer tier
	replicas int       // --replicas (with on)
	fresh    int       // the node whose machine is new at this session's start; -1: none
	forge    forgeMode // the copies on the machines, before this session
	// quiet: no store fault in this session (a new machine's node, the
	// peer tier on), so that what its peers hold is owed (peerRead).
	quiet bool
	// lostAt: every machine of the job is lost at once (each agent's
	// context ends: no notice, no stop checkpoint), so that the newest
	// checkpoint is a periodic one, whose parts the keepers copied
	// (--replicas); -1: none.
	lostAt time.Duration
}

func (s peerShape) String() string {
	if s == (peerShape{fresh: -1, lostAt: -1}) {
		return ""
	}
	return fmt.Sprintf(" copies(keep=%d peer=%v replicas=%d fresh=node-%d forge=%s quiet=%v lost-at=%s)", s.keep, s.on, s.replicas, s.fresh, s.forge, s.quiet, s.lostAt)
}

// drawPeerShape draws session k's shape for a job of nodes nodes: the
// tiers once for the job (its sessions run one configuration), what
// happens to the machines before each later session.
func drawPeerShape(seed uint64, k, nodes int) peerShape {
	if prePeerSeeds[seed] {
		return peerShape{fresh: -1, lostAt: -1}
	}
	job := rand.New(rand.NewPCG(seed^0x9ee7, 0))
	s := peerShape{keep: pick(job, 0, 1, 1, 2), on: job.IntN(100) < 80, fresh: -1, lostAt: -1}
	if s.on {
		s.replicas = job.IntN(2)
	}
	r := rand.New(rand.NewPCG(seed^0x9ee7, uint64(k)))
	if s.on && r.IntN(100) < 30 {
		s.lostAt = time.Duration(60+r.IntN(190)) * time.Second
	}
	if k > 1 {
		if r.IntN(2) == 0 {
			s.fresh = r.IntN(nodes)
		}
		s.quiet = s.fresh >= 0 && s.on && r.IntN(2) == 0
		if !s.quiet {
			s.forge = pick(r, forgeNone, forgeOne, forgeAll)
		}
	}
	return s
}

// drawDP draws whether a job's ranks save data-parallel copies.
func drawDP(seed uint64) bool {
	if prePeerSeeds[seed] {
		return false
	}
	return rand.New(rand.NewPCG(seed^0xd9, 1)).IntN(2) == 0
}

// dpContent is rank's data-parallel copy for checkpoint id at step: the
// same bytes on every rank.
func dpContent(seed uint64, id string, step int64) []byte {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/dp", seed, id)
	r := rand.New(rand.NewPCG(h.Sum64(), uint64(step)))
	b := fmt.Appendf(nil, "%s weights step %d\n", id, step)
	for range 1024 + r.IntN(2048) {
		b = append(b, byte(r.Uint32()))
	}
	return b
}

// peerChecked counts what the checks here checked, over a TestAgentSim
// run: restores with bytes from a peer (the journal's), resumes of a
// checkpoint of which a copy on one of the machines was forged, and the
// sessions where a new machine's node owed its peers' copies (peerRead).
var peerChecked struct{ peer, forged, owed atomic.Int64 }

// peerWant is what a new machine's node must not read from the store
// (peerRead): its part's objects that peers hold intact, by key.
type peerWant struct {
	node string
	step int64
	keys map[string]string // object key → path
	// over: the session's first commit landed, a node's agent ended or a
	// second copy of a node started (its restore may find the keeper
	// gone: seed 108458): the check is over.
	over bool
}

// nodeIP is the address of slot n's machine on the job's network.
func nodeIP(n int) string { return fmt.Sprintf("10.0.0.%d", n+1) }

// peerConfig is node slot n's local and peer tiers in a session of shape s.
func (w *world) peerConfig(s peerShape, n int) (keep int, pc localdirs.PeerTierConfig) {
	if !s.on {
		return s.keep, pc
	}
	if w.net == nil {
		w.net = memnet.New()
	}
	ip := nodeIP(n)
	return s.keep, localdirs.PeerTierConfig{Enabled: true, Listen: ip + ":0", Advertise: []string{ip}, Replicas: s.replicas, Network: w.net.Host(ip)}
}

// peerStart empties the new machine's directory and forges what s says
// on the others', before session k's agents start; with no store fault
// (quiet), what the new machine's node must restore from its peers.
func (w *world) peerStart(s peerShape, js jobShape, newest *checkpoint.Manifest, quiet bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.peerWant = nil
	if quiet && s.on && s.keep > 0 && s.fresh >= 0 && newest != nil {
		defer func() {
			// Not where a copy of it was forged: the peer tier is one
			// tier to restore, so a file whose first peer's copy is
			// refused comes from the store, not from the next peer
			// (seed 575; that peer is not asked again).
			if !w.peerForged[newest.ID] {
				w.peerOwedLocked(s, js, newest)
			}
		}()
	}
	if s.fresh >= 0 {
		if err := os.RemoveAll(filepath.Join(w.dir, fmt.Sprintf("node-%d", s.fresh))); err != nil {
			w.violateLocked("empty node-%d's machine: %v", s.fresh, err)
			return
		}
		w.logLocked("host: node-%d's machine is new: every copy it kept is gone", s.fresh)
	}
	if s.forge == forgeNone {
		return
	}
	var files []copyFile // localtier_test.go
	for n := range js.nodes {
		files = append(files, w.copyFilesLocked(filepath.Join(w.dir, fmt.Sprintf("node-%d", n), localdirs.AreaPrefix+"sim"))...)
	}
	files = forgedOf(files, s.forge, newest)
	for _, f := range files {
		if err := forgeCopy(f.path); err != nil {
			w.violateLocked("forge %s: %v", f.path, err)
			return
		}
		if w.peerForged == nil {
			w.peerForged = map[string]bool{}
		}
		w.peerForged[f.id] = true
		w.logLocked("host: forged %s", strings.TrimPrefix(f.path, w.dir+"/"))
	}
}

// peerOwedLocked records which files of the new machine's part of
// newest the other nodes' machines hold with the bytes written (w.mu
// held): their objects are owed to the peers (peerRead).
func (w *world) peerOwedLocked(s peerShape, js jobShape, newest *checkpoint.Manifest) {
	part := fmt.Sprintf("node-%d", s.fresh)
	want := &peerWant{node: part, step: newest.Step, keys: map[string]string{}}
	written := w.files[newest.ID]
	intact := func(p string, b []byte) bool {
		got, err := os.ReadFile(p)
		return err == nil && b != nil && bytes.Equal(got, b)
	}
	folder := fmt.Sprintf("%012d-%s", newest.Step, newest.ID)
	for _, f := range newest.Files {
		if f.Part != part {
			continue
		}
		held := false
		for n := range js.nodes {
			if n == s.fresh || held || !w.recordHoldsLocked(n, folder) {
				continue
			}
			tier := filepath.Join(w.dir, fmt.Sprintf("node-%d", n), localdirs.AreaPrefix+"sim", localdirs.TierSub)
			// A replica of the part (--replicas 1), or a data-parallel
			// copy of the same bytes in that node's own part.
			held = s.replicas > 0 && intact(filepath.Join(tier, folder+"+"+part, filepath.FromSlash(f.Path)), written[f.Path])
			for _, g := range newest.Files {
				if !held && g.Part == fmt.Sprintf("node-%d", n) && strings.HasPrefix(g.Path, "dp/") && g.Size == f.Size && g.BLAKE3 == f.BLAKE3 {
					held = intact(filepath.Join(tier, folder, filepath.FromSlash(g.Path)), written[f.Path])
				}
			}
		}
		if held {
			want.keys[f.Key] = f.Path
		}
	}
	if len(want.keys) == 0 {
		return
	}
	w.peerWant = want
	peerChecked.owed.Add(1)
	w.logLocked("host: %s's new machine owes its peers %d files of step %d", part, len(want.keys), newest.Step)
}

// recordHoldsLocked: node n's record in the store says it holds the
// copy folder. A restore waits for a peer whose record holds the
// checkpoint (its agent starting again, on the same machine); one whose
// record is another machine's that holds nothing (a second copy of the
// node ran last: seed 3648) is not asked, and rightly so.
func (w *world) recordHoldsLocked(n int, folder string) bool {
	b, ok := w.st.Peek(fmt.Sprintf("peers/node-%d.json", n)) // peertier's recordKey
	if !ok {
		return false
	}
	var rec struct {
		Holds []string `json:"holds"`
	}
	return json.Unmarshal(b, &rec) == nil && slices.Contains(rec.Holds, folder)
}

// peerRead: op was asked of the store (a get) or landed (a put).
func (w *world) peerRead(op storesim.Op) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pw := w.peerWant
	if pw == nil || pw.over {
		return
	}
	switch {
	case op.Kind == storesim.OpPut && strings.HasSuffix(op.Key, "/"+checkpoint.ManifestName):
		pw.over = true
	case op.Kind == storesim.OpGet:
		if p, ok := pw.keys[op.Key]; ok {
			w.violateLocked("%s read %s of step %d from the store: a peer's machine held it intact, the store quiet, the peer tier on", pw.node, p, pw.step)
		}
	}
}

// peerOver: the host acted (a signal, a notice, a kill, a loss, a second
// copy) or a node's agent ended: what was owed is owed no more.
func (w *world) peerOver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.peerWant != nil {
		w.peerWant.over = true
	}
}

// peerResumed: a rank of a job was handed checkpoint id (its bytes
// checked by resumed). w.mu held.
func (w *world) peerResumedLocked(id string) {
	if w.peerForged[id] {
		peerChecked.forged.Add(1)
	}
}

// peerEnd counts the restores of the run's journal that read bytes from
// a peer.
func (w *world) peerEnd() {
	b, ok := w.st.Peek(checkpoint.JournalKey)
	if !ok {
		return
	}
	var j journal.Journal
	if json.Unmarshal(b, &j) != nil {
		return
	}
	for _, e := range j.Restores {
		if e.From[checkpoint.FromPeer] > 0 {
			peerChecked.peer.Add(1)
		}
	}
}
