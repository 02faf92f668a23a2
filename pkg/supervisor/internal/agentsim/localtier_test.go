package agentsim

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/internal/testutil/forge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// This machine's copies (issue 49: the end-to-end TestRun_RestoreFromLocal
// and TestDigest_ForgedLocalCopyNeverUsed were cut; these hold their
// guarantees), in the sessions of one agent (hosted and run mode; not part
// mode). The sessions of a schedule share one checkpoint directory, as
// the runs of one machine do: each keeps Config.LocalKeep committed
// checkpoints in its area's local tier (<area>/committed; 0 turns it off
// and deletes what an earlier session kept), and its restores leave their
// checkpoint in <area>/restore. Before a later session starts, the data
// files of one or every copy there may be rewritten with other bytes of
// the same size and CRC32C (forge.Like), as a hostile local user or a bad
// disk could. The properties:
//
//   - a forged copy is never handed to a trainer: every resume's files are
//     the bytes the trainer wrote (checked at every resume, resumed in
//     agentsim_test.go), so the agent refused each forged file by the
//     manifest's digest and read the genuine one from the store;
//   - a session whose local tier is on and holds an intact copy of the
//     newest complete checkpoint at its start restores it from the
//     machine: it reads none of that checkpoint's objects from the store
//     until the session's first commit (localRead); when one file of that
//     copy was forged, only that file comes from the store (the end-to-end
//     TestDigest_ForgedPeerAndReplicaNeverUsed held it for a real agent).
//
// Drawn from a generator of their own (drawLocalShape), so that the
// schedules' other draws stay what they were.

// localShape is what a session draws for this machine's copies.
type localShape struct {
	keep  int       // Config.LocalKeep
	forge forgeMode // before the session starts
}

// forgeMode is what is forged before a session.
type forgeMode int

const (
	forgeNone forgeMode = iota
	forgeOne            // one data file of one copy (the newest complete checkpoint's when there is one)
	forgeAll            // every data file of every copy
)

func (m forgeMode) String() string { return [...]string{"none", "one", "all"}[m] }

func (s localShape) String() string {
	return fmt.Sprintf(" local(keep=%d forge=%s)", s.keep, s.forge)
}

func drawLocalShape(seed uint64, k int) localShape {
	r := rand.New(rand.NewPCG(seed^0x10ca1, uint64(k)))
	s := localShape{keep: pick(r, 0, 1, 1, 2)}
	if k > 1 {
		s.forge = pick(r, forgeNone, forgeNone, forgeOne, forgeAll)
	}
	return s
}

// localState is a session's account of this machine's copies (w.mu).
type localState struct {
	// want: the newest complete checkpoint at the start, its copy intact
	// in the local tier, which is on: no object of it is read from the
	// store until the session's first commit (committed).
	want      *checkpoint.Manifest
	committed bool
	forged    map[string]bool // ids of checkpoints with a forged file on this machine
	// exempt: the paths of want forged here (forgeOne), which the store
	// rightly serves; every other file of want still comes from the
	// machine.
	exempt map[string]bool
}

// localChecked counts what the checks here checked, over a TestAgentSim
// run: resumes of a checkpoint restored from an intact local copy, and of
// one whose copy on this machine was forged.
var localChecked struct{ local, forged, onlyForged atomic.Int64 }

// copyDir is the name of a checkpoint's copy on this machine:
// <step, 12 digits>-<id>.
var copyDir = regexp.MustCompile(`^[0-9]{12}-([0-9a-f]{12})$`)

// copyFile is one data file of a copy on a machine: its checkpoint's id
// and its path.
type copyFile struct{ id, path string }

// copyFilesLocked lists the data files of every copy in area (w.mu held):
// the paths a rank wrote for it (w.files), never the agent's own files
// beside them, in the local tier (another node's part beside a copy:
// <step>-<id>+node-<k>, peers_test.go) or the last restore's directory.
func (w *world) copyFilesLocked(area string) []copyFile {
	var files []copyFile
	for _, sub := range []string{localdirs.TierSub, localdirs.RestoreSub} {
		ents, _ := os.ReadDir(filepath.Join(area, sub))
		for _, e := range ents {
			name, _, _ := strings.Cut(e.Name(), "+")
			m := copyDir.FindStringSubmatch(name)
			if m == nil || !e.IsDir() {
				continue
			}
			for _, p := range slices.Sorted(mapsKeys(w.files[m[1]])) {
				if _, err := os.Stat(filepath.Join(area, sub, e.Name(), p)); err == nil {
					files = append(files, copyFile{m[1], filepath.Join(area, sub, e.Name(), p)})
				}
			}
		}
	}
	return files
}

// forgedOf is what mode forges of files: none, all, or one (of newest
// when there is one).
func forgedOf(files []copyFile, mode forgeMode, newest *checkpoint.Manifest) []copyFile {
	switch {
	case mode == forgeNone:
		return nil
	case mode == forgeOne && len(files) > 0:
		at := 0
		if newest != nil {
			if i := slices.IndexFunc(files, func(f copyFile) bool { return f.id == newest.ID }); i >= 0 {
				at = i
			}
		}
		return files[at : at+1]
	}
	return files
}

// localStart forges what the session's shape says on this machine's
// copies and records what the session must restore from them.
func (w *world) localStart(s localShape, newest *checkpoint.Manifest) {
	area := filepath.Join(w.dir, localdirs.AreaPrefix+"sim")
	ls := &localState{forged: map[string]bool{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.local = ls
	files := forgedOf(w.copyFilesLocked(area), s.forge, newest)
	exempt := map[string]bool{}
	for _, f := range files {
		if err := forgeCopy(f.path); err != nil {
			w.violateLocked("forge %s: %v", f.path, err)
			return
		}
		ls.forged[f.id] = true
		if newest != nil && f.id == newest.ID {
			// <area>/<sub>/<copy>/<path>: the path of the file in the checkpoint.
			rel, _ := filepath.Rel(area, f.path)
			if parts := strings.SplitN(filepath.ToSlash(rel), "/", 3); len(parts) == 3 {
				exempt[parts[2]] = true
			}
		}
		w.logLocked("host: forged %s", strings.TrimPrefix(f.path, area+"/"))
	}
	if newest == nil || s.keep < 1 || (ls.forged[newest.ID] && s.forge != forgeOne) {
		return
	}
	kept := filepath.Join(area, localdirs.TierSub, fmt.Sprintf("%012d-%s", newest.Step, newest.ID))
	for _, f := range newest.Files {
		if exempt[f.Path] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(kept, filepath.FromSlash(f.Path)))
		if err != nil || !bytes.Equal(b, w.files[newest.ID][f.Path]) {
			return
		}
	}
	ls.want, ls.exempt = newest, exempt
	if len(exempt) > 0 {
		w.logLocked("host: the local tier holds step %d (%s) intact but for %d forged file(s)", newest.Step, newest.ID, len(exempt))
		return
	}
	w.logLocked("host: the local tier holds step %d (%s) intact", newest.Step, newest.ID)
}

// forgeCopy rewrites the file at p with other bytes of its size and,
// when it has four or more, its CRC32C.
func forgeCopy(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	fake, err := forge.Like(b, []byte("EVIL-WEIGHTS"))
	if err != nil { // too short for a CRC: other bytes all the same
		fake = bytes.Clone(b)
		for i := range fake {
			fake[i] ^= 0xff
		}
	}
	if bytes.Equal(fake, b) {
		fake[0] ^= 1
	}
	return os.WriteFile(p, fake, 0o600)
}

// localRead: op was asked of the store (a get) or landed (a put).
func (w *world) localRead(op storesim.Op) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := w.local
	if ls == nil || ls.want == nil || ls.committed {
		return
	}
	switch {
	case op.Kind == storesim.OpPut && strings.HasSuffix(op.Key, "/"+checkpoint.ManifestName):
		ls.committed = true
	case op.Kind == storesim.OpGet:
		for _, f := range ls.want.Files {
			if f.Key == op.Key && !ls.exempt[f.Path] {
				w.violateLocked("read %s of step %d from the store: the local tier held it intact (keep on) at the session's start", f.Path, ls.want.Step)
			}
		}
	}
}

// localResumed: a rank was handed checkpoint id (its bytes checked by
// resumed).
func (w *world) localResumed(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := w.local
	if ls == nil {
		return
	}
	if ls.want != nil && ls.want.ID == id && !ls.committed {
		localChecked.local.Add(1)
		if len(ls.exempt) > 0 {
			localChecked.onlyForged.Add(1)
		}
	}
	if ls.forged[id] {
		localChecked.forged.Add(1)
	}
}
