package supervisor

import (
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/supervisor/childproc"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/trainers"
)

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
		"this start resumes from the newest committed checkpoint and the trainer trains again from there "+
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
	log.Info("run finished: deleted its local copies from the default cache directory (the store keeps every committed checkpoint)",
		zap.String("area", d.AreaPath), zap.Duration("took", time.Since(start)))
}
