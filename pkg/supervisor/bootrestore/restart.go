package bootrestore

import (
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
)

// A restart's restore: a trainer that failed on its own is started again
// from the newest committed checkpoint (childproc.Process's restart). The
// restore runs beside the loop, as every restore but the serial start's
// does, so that the agent keeps answering meanwhile: a signal or a
// termination notice cancels it (CancelRestart: its partial directory
// goes, restore.Into removes it), the trainer is not started again, and
// the stop goes on as when no trainer runs. A hello meanwhile waits for
// it as for the start's overlapped restore (Hello).

// StartRestart starts a restart's restore beside the loop; its end comes
// on RestartDone. The caller checks that no restore is Busy.
func (b *Boot) StartRestart() {
	b.env.Log.Info("trainer restarts: restoring the newest committed checkpoint first")
	b.restart = b.beside()
}

// Restarting: a restart's restore runs.
func (b *Boot) Restarting() bool { return b.restart != nil }

// RestartDone is the loop's source of the restart's restore's end (nil:
// none running).
func (b *Boot) RestartDone() <-chan Result {
	if b.restart == nil {
		return nil
	}
	return b.restart.done
}

// CancelRestart cancels the restart's restore, for why; true when one was
// running. Its end still comes on RestartDone, and is not used.
func (b *Boot) CancelRestart(why string) bool {
	p := b.restart
	if p == nil || p.why != "" {
		return false
	}
	b.env.Log.Warn("stop during a restart's restore: cancelling it; the trainer is not started again", zap.String("why", why))
	p.Cancel(why)
	return true
}

// OnRestarted: the restart's restore ended (res); the hellos that came
// meanwhile learn how. start: the restore is in place and recorded
// (Env.Record): the trainer starts again. A failed one returns its err,
// after its metric; a cancelled one neither (the stop that cancelled it
// gave the trainer up).
func (b *Boot) OnRestarted(res Result) (start bool, err error) {
	p := b.restart
	b.restart = nil
	switch {
	case p.why != "":
		if res.Fetched != nil {
			b.env.Log.Info("restore for restart finished after it was cancelled: not used", zap.String("why", p.why))
		}
		p.tellFailed("restore cancelled: " + p.why)
		return false, nil
	case res.Err != nil:
		b.env.Log.Error("restore for restart failed", zap.Error(res.Err))
		b.env.Errs()
		p.tellFailed(res.Err.Error())
		return false, res.Err
	}
	b.resume = b.env.Record(res.Fetched)
	p.Restored(b.resume, b.env.Log, b.env.Hand, func(ev protocol.Event) { b.env.Admit(ev, b.resume) })
	return true, nil
}
