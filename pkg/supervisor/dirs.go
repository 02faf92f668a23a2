package supervisor

import (
	"context"
	"os"
	"strconv"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
)

// localDirs are the agent's local directories (pkg/supervisor/localdirs)
// with what they do for a request: its directory's parent, its removal,
// its committed copy in the local tier.
type localDirs struct{ localdirs.Dirs }

// PeerTierConfig turns on the peer tier of a multi-node job's node
// (pkg/supervisor/localdirs).
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
	if d.Tier == nil || r.parent != nil {
		return
	}
	node := ""
	if part != nil {
		node = part.Node
	}
	if err := d.Tier.Keep(ctx, r.rel, res.Manifest, node, copyOK); err != nil {
		log.Warn("no local copy of the committed checkpoint: a restart here restores it from the store", zap.String("id", r.id), zap.Error(err))
		return
	}
	d.PublishPeer(ctx, res.Manifest, copyOK, log) // pkg/supervisor/localdirs
}
