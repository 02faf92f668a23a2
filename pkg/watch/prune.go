package watch

import (
	"context"
	"os"
	"sort"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Prune deletes from DIR the checkpoints older than committed (the newest
// committed step), keeping the newest keep checkpoints of DIR whatever
// their state. Only spotagent run --watch-prune calls it: by default the
// agent never deletes the trainer's files. It returns the names deleted.
// Every read and delete goes through DIR as New opened it, so a name the
// trainer swaps for a symlink meanwhile removes the link, never what it
// points to. A name for which busy (if not nil) says true is kept: the
// agent is staging or uploading it. Prune may take long (it deletes whole
// checkpoints): it stops between two deletions once ctx ends.
func (w *Watcher) Prune(ctx context.Context, committed int64, keep int, busy func(name string) bool) []string {
	dir := w.root
	ents, err := readDir(dir, ".")
	if err != nil {
		return nil
	}
	type cand struct {
		name string
		step int64
	}
	var all []cand
	for _, e := range ents {
		if !w.namer.Match(e.Name()) || e.Type()&os.ModeSymlink != 0 {
			continue
		}
		step, err := w.namer.Step(e.Name(), !e.IsDir())
		if err != nil {
			continue
		}
		all = append(all, cand{e.Name(), step})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].step > all[j].step })
	var gone []string
	for i, c := range all {
		if i < keep || c.step >= committed || (busy != nil && busy(c.name)) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if err := removeEntry(dir, c.name); err != nil {
			w.log.Warn("watch prune: could not delete an old checkpoint", zap.String("name", c.name), zap.Error(err))
			continue
		}
		gone = append(gone, c.name)
	}
	if len(gone) > 0 {
		w.log.Info("watch prune: deleted old checkpoints from the watched directory", zap.Strings("names", gone), zap.Int64("committed_step", committed))
	}
	return gone
}

// removeEntry deletes name below dir: a directory with what it holds, a
// file or a symlink itself.
func removeEntry(dir *os.Root, name string) error {
	fi, err := dir.Lstat(name)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return checkpoint.RemoveDir(dir, name, nil)
	}
	return dir.Remove(name)
}
