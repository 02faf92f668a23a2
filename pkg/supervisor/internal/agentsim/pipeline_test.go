package agentsim

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// The pipelined save (issue 49: the end-to-end TestPipeline_ModifiedAfterSaved
// was cut; this holds its guarantee). Half of the saves report each file
// `saved` as soon as its last chunk is written, and the agent uploads it
// early (every checkpoint here is below the pace's 64 MiB: early). A
// quarter of the files so reported are then changed before the rank's
// `done`: appended to in place, or replaced by a new file of the same
// size (another inode). A file's identity (inode, size, mtime, ctime) is
// what tells the agent; the same size rewritten in place within the file
// system clock's tick is its 50 ms re-check (real time, which the
// bubble's fake clock is not: pkg/checkpoint/commit
// TestPipeline_FileChangedAfterSaved and TestPipeline_JustWrittenReadOnce
// hold that). One save in eight also sends saved messages the agent must
// refuse (a path outside the directory, one already reported, a missing
// file): each gets an error reply and uploads nothing.
//
// The properties are the store's and the resume's (agentsim_test.go): every
// manifest's objects are the bytes the ranks had written at their done,
// never what an early upload read before a change, and nothing else; the
// pipeline's own counts (pipeChecked) show that early uploads landed and
// that checkpoints with a changed file committed.
//
// Drawn from a generator of its own (pipePlan), so that the schedules'
// other draws stay what they were.

// pipeAct is one step of a save beside its writes: a saved message, a
// change to a file already reported saved, or a saved to refuse.
type pipeAct struct {
	at   time.Duration // from the request's arrival
	kind pipeKind
	path string
	abs  bool // actSaved: the path absolute (inside the directory: as good)
}

type pipeKind int

const (
	actSaved pipeKind = iota
	actAppend
	actReplace
	actBadSaved
)

// pipeChecked counts over a TestAgentSim run: early objects that landed
// before any rank said done, and committed checkpoints holding a file
// changed after it was reported saved.
var pipeChecked struct{ early, changed atomic.Int64 }

// pipePlan draws what a save of files (written as chunks say, done at
// wait) does beside its writes: nil for a save that reports nothing.
func (t *trainer) pipePlan(step int64, paths []string, chunks []saveChunk, wait time.Duration) []pipeAct {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/pipe/%d", t.w.seed, t.rank)
	r := rand.New(rand.NewPCG(h.Sum64(), uint64(step)))
	if r.IntN(2) == 0 {
		return nil
	}
	var acts []pipeAct
	for _, p := range paths {
		last := chunks[slices.IndexFunc(chunks, func(c saveChunk) bool { return c.path == p })].at
		for _, c := range chunks {
			if c.path == p {
				last = max(last, c.at)
			}
		}
		acts = append(acts, pipeAct{at: last, kind: actSaved, path: p, abs: r.IntN(2) == 0})
		if r.IntN(4) == 0 {
			at := last + time.Duration(r.Int64N(int64(max(wait-last, 0))+1))
			acts = append(acts, pipeAct{at: at, kind: pick(r, actAppend, actReplace), path: p})
		}
	}
	if r.IntN(8) == 0 {
		for _, bad := range []string{"../outside.bin", paths[0], "missing.bin"} {
			acts = append(acts, pipeAct{at: time.Duration(r.Int64N(int64(max(wait, 0)) + 1)), kind: actBadSaved, path: bad})
		}
	}
	slices.SortStableFunc(acts, func(a, b pipeAct) int { return int(a.at - b.at) })
	return acts
}

// pipeDo does a; files is the save's content, changed with the file. It
// runs in the answer's goroutine: it draws nothing (t.rng is the
// connection's).
func (t *trainer) pipeDo(a pipeAct, id string, step int64, dir string, files map[string][]byte) bool {
	full := filepath.Join(dir, filepath.FromSlash(a.path))
	switch a.kind {
	case actSaved, actBadSaved:
		p := a.path
		if a.abs {
			p = full
		}
		return t.send(map[string]any{"type": protocol.TypeSaved, "id": id, "path": p, "step": step}) == nil
	case actAppend:
		f, err := os.OpenFile(full, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return false
		}
		more := fmt.Appendf(nil, "changed after saved at %s\n", time.Now().Format(time.TimeOnly))
		_, err = f.Write(more)
		f.Close()
		if err != nil {
			return false
		}
		files[a.path] = append(files[a.path], more...)
	case actReplace:
		// Other bytes after the first line, which names the save
		// (checkEveryRank); one with nothing after it is appended to.
		b := bytes.Clone(files[a.path])
		body := bytes.IndexByte(b, '\n') + 1
		if body == len(b) {
			return t.pipeDo(pipeAct{at: a.at, kind: actAppend, path: a.path}, id, step, dir, files)
		}
		for i := body; i < len(b); i++ {
			b[i] ^= 0x5a
		}
		tmp := full + ".tmp"
		if os.WriteFile(tmp, b, 0o644) != nil || os.Rename(tmp, full) != nil {
			return false
		}
		files[a.path] = b
	}
	t.w.mu.Lock()
	if t.w.changed == nil {
		t.w.changed = map[string]bool{}
	}
	t.w.changed[id] = true
	t.w.mu.Unlock()
	t.logf("changed %s of %s after saved (%s)", a.path, id, [...]string{"", "appended", "replaced"}[a.kind])
	return true
}

// pipeLanded: an object landed in the store (w.mu held): an early
// upload when no rank has said done for its checkpoint yet.
func (w *world) pipeLanded(key string) {
	if !strings.HasPrefix(key, checkpoint.CheckpointsDir) || strings.HasSuffix(key, "/"+checkpoint.ManifestName) || strings.Contains(key, "/parts/") {
		return
	}
	m := objectID.FindString(key)
	if m == "" {
		return
	}
	id := m[len(m)-12:]
	if len(w.asked[id]) == 0 {
		return
	}
	for _, a := range w.asked[id] {
		if !a.done.IsZero() {
			return
		}
	}
	pipeChecked.early.Add(1)
}

// pipeEnd counts the committed checkpoints holding a changed file.
func (w *world) pipeEnd() {
	for _, m := range w.manifests() {
		w.mu.Lock()
		if w.changed[m.ID] {
			pipeChecked.changed.Add(1)
		}
		w.mu.Unlock()
	}
}
