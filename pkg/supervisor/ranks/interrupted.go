package ranks

import (
	"strconv"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
)

// StopLauncherExit is the agent's code for a node of a multi-node job
// whose launcher exited 1 while the job's interruption or shutdown stop
// ran, and none of exitCodeFor's
// other cases applied (#37 item 4): the stop's checkpoint did not commit
// and no rank wrote 75 (ranks that lost a peer mid-stop and exited 1 on
// their own, as training scripts that catch exceptions do; a torchrun whose
// store host vanished). An interruption is never the job's bug: 75, unless
// a rank of this node crashed before the stop (a bug stays 1), and after a
// peer lost before the stop, whatever the other nodes' crash records say
// (peerLossExit).
func (w *Tracker) StopLauncherExit(code int) int {
	for pid, said := range w.left { // noted only while no stop ran: before it
		if said != strconv.Itoa(protocol.ExitInterrupted) {
			w.env.Log.Info("trainer exited 1 during the stop, after a rank of this node crashed before it: exiting 1",
				zap.Int("code", code), zap.Int("rank_pid", pid), zap.String("exit_file", said))
			return code
		}
	}
	if w.verdict == verdictPeerLost {
		return w.PeerLossExit(code) // tracker.go
	}
	w.env.Log.Info("trainer exited 1 during the job's stop and no rank crashed before it: exiting 75 (an interruption is not the job's bug)",
		zap.Int("code", code))
	return protocol.ExitInterrupted
}
