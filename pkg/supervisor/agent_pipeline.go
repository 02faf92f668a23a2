package supervisor

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// onSaved starts uploading one file of a requested checkpoint before the
// trainer is done with the rest (commit.Pipeline). A `saved` the agent
// cannot use -- no such pending request, a path outside its directory, a
// path already reported, a missing file or anything but a regular file --
// gets an error reply and is otherwise ignored: nothing is uploaded from
// it, and the checkpoint goes on. That is the safer choice: done scans and
// verifies every file whatever `saved` said, so a refused hint costs only
// speed, whereas failing the whole checkpoint would let a trainer bug (or
// a file name it got wrong) lose an interruption checkpoint. The exception
// is a file a trainer of another user reports that is not its own
// (checkpoint.ErrNotOwned: another owner, or a hard link): never read, it
// fails the checkpoint, as it would at done.
func (a *Agent) onSaved(c *protocol.Conn, m protocol.Message) {
	r, ok := a.commits.pending[m.ID]
	if m.ID == "" || !ok || !r.waiting[c.ID()] {
		a.conns.Reply(c, m.ID, fmt.Sprintf("saved: unknown checkpoint id %q", m.ID))
		return
	}
	err := a.startEarly(r, c, m)
	switch {
	case errors.Is(err, checkpoint.ErrNotOwned):
		// Not a wrong hint: a file the trainer may not read. Nothing of
		// it was read, and the checkpoint fails at done (the owner rule, below).
		a.log.Error("saved refused: not the trainer's own file: the checkpoint will not be committed", zap.String("id", r.id), zap.String("path", m.Path),
			zap.Int("peer_uid", c.PeerUID()), zap.Error(err))
		a.conns.Reply(c, m.ID, fmt.Sprintf("saved %q: %v: this checkpoint will not be committed", m.Path, err))
	case err != nil:
		a.log.Warn("saved refused: the file is checked at done like any other", zap.String("id", r.id), zap.String("path", m.Path), zap.Error(err))
		a.conns.Reply(c, m.ID, fmt.Sprintf("saved %q: %v", m.Path, err))
	}
}

func (a *Agent) startEarly(r *request, c *protocol.Conn, m protocol.Message) error {
	rel, err := savedRel(r.dir, m.Path)
	if err != nil {
		return err
	}
	if r.held == nil {
		// Held from here to its removal, as for the commit: every early
		// upload reads through this handle, never by path.
		if r.held, err = checkpoint.OpenDir(a.dirs.Root, r.rel); err != nil {
			return err
		}
	}
	if r.pipe == nil {
		// The objects' prefix: the step the trainer reports, never below
		// the newest commit's. Retention deletes, as an abandoned
		// checkpoint's, the objects below the oldest checkpoint it keeps
		// that no manifest names; a prefix below it, named by a rank
		// behind the others, lost its early objects to a retention under
		// way while the checkpoint committed at a newer step, latest.json
		// then naming a partial checkpoint (TestAgentSim seed 28600).
		step := a.commits.lastStep
		if m.Step != nil && *m.Step > step {
			step = *m.Step
		}
		r.pipe = a.job.pipeline(a.life, a.commits.committer, r.held, step, r.id)
		if a.stops.current != nil && !r.urgent() {
			r.pipe.Halt()
		}
	}
	// A trainer of another user uploads only its own files: its peer uid
	// must own each one (and as at done, one link each).
	if err := r.pipe.Add(rel, foreignUID(c)...); err != nil {
		return err
	}
	if r.urgent() && r.pipe.Uploading() {
		// The interruption checkpoint's upload began with this file:
		// the periodic uploads in flight give way now, not at its done
		// (found by the agent simulation).
		a.commits.cancelPeriodic(a.log)
	}
	return nil
}

// savedRel turns a saved message's path (relative to dir, or absolute and
// inside it) into a "/"-separated path relative to dir.
func savedRel(dir, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path is required")
	}
	if filepath.IsAbs(p) {
		rel, err := filepath.Rel(dir, filepath.Clean(p))
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "", fmt.Errorf("not inside the checkpoint directory %s: %w", dir, checkpoint.ErrUnsafePath)
		}
		p = rel
	}
	rel := filepath.ToSlash(p)
	if err := checkpoint.SafeRel(rel); err != nil {
		return "", fmt.Errorf("not a path inside the checkpoint directory: %w", err)
	}
	return rel, nil
}
