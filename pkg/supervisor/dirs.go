package supervisor

// The local directories as the agent holds them (localDirs): a request
// directory's parent and removal, its committed copy kept in the local
// tier and published to the peer tier, what is handed to a trainer of
// another uid; and the endings that are true: work finished, recorded and
// said at the next start, a finished run's copies deleted.

import (
	"context"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
)

// localDirs are the agent's local directories (pkg/supervisor/internal/localdirs)
// with what they do for a request: its directory's parent, its removal,
// its committed copy in the local tier.
type localDirs struct{ localdirs.Dirs }

// PeerTierConfig turns on the peer tier of a multi-node job's node
// (pkg/supervisor/internal/localdirs).
type PeerTierConfig = localdirs.PeerTierConfig

// childSaid75 reports whether the trainer's ranks wrote 75 to the exit
// file: they were stopped for an interruption or shutdown.
func (d *localDirs) childSaid75() bool { return d.ExitFileSays() == strconv.Itoa(ExitInterrupted) }

// parentRoot is the open directory r.rel names r's directory in.
func (d *localDirs) parentRoot(r *request) *os.Root {
	if r.parent != nil {
		return r.parent
	}
	return d.Root
}

// removeDir deletes r's directory through the agent's handles: never
// anything outside the checkpoint directory, and, once the directory was
// opened for the commit, only what that directory holds.
func (d *localDirs) removeDir(r *request, goBg func(func()), log *zap.Logger) {
	if r.pipe != nil {
		r.pipe.Abort() // after a commit, a no-op; else its early uploads go
		goBg(r.pipe.Wait)
	}
	if err := checkpoint.RemoveDir(d.parentRoot(r), r.rel, r.held); err != nil {
		log.Warn("could not remove a checkpoint directory", zap.String("dir", r.dir), zap.Error(err))
	}
	if r.held != nil {
		r.held.Close()
		r.held = nil
	}
}

// keep makes the committed checkpoint of r (res) the local tier's copy,
// when there is a tier and r's directory is below the checkpoint
// directory (not watch mode's stage); only by hard links when copyOK is
// false (a stop's checkpoint: the trainer waits for committed). Run in
// the commit's goroutine, before the loop deletes r's directory.
func (d *localDirs) keep(ctx context.Context, r *request, res *commit.Result, part *checkpoint.PartSpec, copyOK bool, log *zap.Logger) {
	if d.Tier() == nil || r.parent != nil {
		return
	}
	node := ""
	if part != nil {
		node = part.Node
	}
	if err := d.Tier().Keep(ctx, r.rel, res.Manifest, node, copyOK); err != nil {
		log.Warn("no local copy of the committed checkpoint: a restart here restores it from the store", zap.String("id", r.id), zap.Error(err))
		return
	}
	d.PublishPeer(ctx, res.Manifest, copyOK, log) // pkg/supervisor/internal/localdirs
}

// handDir gives the request directory id to the uid of the trainers it
// goes to when that is another user's than the agent's and the agent runs
// as root (node or sidecar mode with --allow-uid): that uid alone may
// write it, and the agent's directories above it get the search bit so
// that the trainer can reach it by name (localdirs.LetThrough). Trainers
// of two other uids cannot share one directory: it stays the agent's
// (logged), and they cannot write it.
func (d *localDirs) handDir(log *zap.Logger, id string, ranks map[uint64]*protocol.Conn) error {
	if os.Geteuid() != 0 {
		return nil
	}
	uid := -1
	for _, c := range ranks {
		u := foreignUID(c)
		if u == nil {
			continue
		}
		if uid >= 0 && u[0] != uid {
			log.Warn("trainers of two other uids answer one request: its directory stays root's, they cannot write it",
				zap.String("id", id), zap.Int("uid", uid), zap.Int("other_uid", u[0]))
			return nil
		}
		uid = u[0]
	}
	if uid < 0 {
		return nil
	}
	for _, r := range []*os.Root{d.Root, d.Area} {
		if err := localdirs.LetThrough(r); err != nil {
			return err
		}
	}
	return localdirs.HandTo(d.Area, id, uid)
}

// handRestore lets trainer c read the restored checkpoint res names
// before it is told of it, when c runs as another user than the agent and
// the agent runs as root (node or sidecar mode with --allow-uid): that
// uid alone may then read it, and nobody may change it
// (localdirs.Dirs.HandRestore). When it cannot (the checkpoint was handed
// to another uid already), the trainer is still told, and its read fails
// with "permission denied": it never resumes from an older checkpoint.
func (d *localDirs) handRestore(log *zap.Logger, res *protocol.Resume, c *protocol.Conn) {
	if res == nil || os.Geteuid() != 0 {
		return
	}
	u := foreignUID(c)
	if u == nil {
		return
	}
	if err := d.HandRestore(res.Dir, res.Manifest, u[0]); err != nil {
		log.Error("the trainer's uid cannot read the restored checkpoint", zap.Uint64("conn", c.ID()), zap.Int("uid", u[0]),
			zap.String("dir", res.Dir), zap.Error(err))
	}
}

// Endings that are true: a run whose trainer finished its work is recorded
// as finished in the journal, the next start says so (a rerun trains again
// from the newest committed checkpoint), and a finished run's copies under
// the default cache directory are deleted (the store keeps them). The
// journal's session records it (journal.Session.MarkFinished).

// finishedWork: the trainer finished its work. In run mode it exited 0
// and the agent exits 0 (nothing told it to stop: exitCodeFor); beside a
// trainer (sidecar, node mode) every trainer that connected said bye.
func finishedWork(command []string, p *childproc.Process, c *trainers.Conns) bool {
	if len(command) == 0 {
		return c.Finished()
	}
	return p.Finished()
}

// sayFinishedBefore warns, at start, that the run's last session ended
// with its trainer's work finished: this start trains again.
func sayFinishedBefore(s *journal.Session, log *zap.Logger) {
	fields := []zap.Field{zap.Time("finished_at", *s.End), zap.String("what_happens",
		"this start resumes from the newest committed checkpoint (or starts fresh when none was committed) and the trainer trains again from there "+
			"(to train further, e.g. more steps, that is what you want); new work needs its own --run-id or store prefix")}
	if s.LastStep != nil {
		fields = append(fields, zap.Int64("finished_step", *s.LastStep))
	}
	if s.Instance.InstanceID != "" {
		fields = append(fields, zap.String("finished_on", s.Instance.InstanceID))
	}
	log.Warn("this run finished before: its trainer exited 0 after its work", fields...)
}

// dropFinishedCopies deletes a finished run's local copies and restored
// checkpoint when the checkpoint directory is the default cache
// (~/.cache/spotagent/RUN-ID), which nobody chose to fill: the store
// keeps every committed checkpoint. A --checkpoint-dir the user named
// keeps them. Called once every goroutine that writes there has returned.
func (d *localDirs) dropFinishedCopies(log *zap.Logger) {
	if d.Area == nil {
		return
	}
	start := time.Now()
	for _, sub := range []string{localdirs.TierSub, localdirs.RestoreSub} {
		if err := d.Area.RemoveAll(sub); err != nil {
			log.Warn("run finished: could not delete its local copies", zap.String("dir", sub), zap.Error(err))
			return
		}
	}
	log.Info("run finished: deleted its local copies from the default cache directory (the store keeps the committed checkpoints, --keep of them)",
		zap.String("area", d.AreaPath), zap.Duration("took", time.Since(start)))
}
