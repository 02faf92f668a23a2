package supervisor

import (
	"context"
	"errors"
	"os"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/bootrestore"
)

// Hosted is what a host that serves the socket itself (node mode,
// pkg/supervisor/nodemode) hands one of its runs: the run's checkpoint
// directory, opened by the host (Dir, closed with the run), the events of
// its trainers' connections, the machine's notices, signals, and the
// status requests its loop answers (Asks; nil: none).
type Hosted struct {
	Dir     *os.Root
	Events  <-chan protocol.Event
	Notices <-chan metadata.Notice
	Signals <-chan os.Signal
	Asks    <-chan chan<- Status
}

// RunHosted runs one agent of a host until its loop ends: cfg.CheckpointDir
// names in.Dir, and the host owns the socket, the notice source and the
// signals. An agent that cannot be made returns its error (in.Dir closed);
// otherwise RunHosted returns nil once the agent's loop and its exit are
// done (see Run for what an exit abandons). ctx ends the run at once.
func RunHosted(ctx context.Context, cfg Config, in Hosted) error {
	a, err := newAgent(ctx, cfg, in.Dir)
	if err != nil {
		in.Dir.Close()
		return err
	}
	defer a.endLife() // after a panic too: its background work stops
	a.asks = in.Asks
	a.commits.pollLease(a.life, a.cfg.FenceInterval, a.fences, a.goBg, a.log) // commits.go
	a.loop(ctx, in.Events, in.Notices, in.Signals)
	a.live.Stop() // pkg/supervisor/internal/ranks: the neighbours hear this node leave
	a.finish()
	return nil
}

// RunHostedChild is Run for a host that serves the socket, hears the
// notices and the signals itself (in, as RunHosted): the agent starts
// cfg.Command with cfg.Child, supervises it and returns the exit code Run
// would (a signal during the start cancels it, as Run's does). Neither
// the signal fallback (cfg.Signal) nor a command's look-up in PATH: they
// need a socket path and a real command. The agent's simulation
// (pkg/supervisor/internal/agentsim) runs it.
func RunHostedChild(ctx context.Context, cfg Config, in Hosted) (int, error) {
	if len(cfg.Command) == 0 || cfg.Signal != 0 {
		in.Dir.Close()
		return 1, errors.New("hosted child: a command and no signal fallback")
	}
	sctx, signals, started, stopSignals := startSignals(ctx, in.Signals, cfg.Log)
	defer stopSignals()
	a, err := newAgent(sctx, cfg, in.Dir)
	if sig := started(); sig != nil {
		if err == nil {
			a.abort()
		}
		in.Dir.Close()
		return bootrestore.StartCancelled(sig)
	}
	if err != nil {
		in.Dir.Close()
		return 1, err
	}
	a.asks = in.Asks
	return a.run(ctx, in.Events, in.Notices, signals, nil)
}
