package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/idlegc"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/nodemode"
)

func newRunCmd() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{
		Use:     "run [flags] -- COMMAND [ARGS...]",
		Short:   "run a trainer: restore, checkpoint on notices and periodically, commit to the store",
		Example: "spotagent run --store s3://my-bucket/runs/exp1 --cloud auto -- python3 train.py",
		Long: `Run a trainer under the agent: restore the newest checkpoint of the run, start COMMAND, ask it
to checkpoint on interruption notices and periodically, commit each checkpoint to the store.
Exit codes: the trainer's; 75 after an interruption whose checkpoint committed (run again);
76 fenced by a newer session; 126/127 trainer not executable/not found; 1 a failure of the
agent; 2 bad usage.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return failf(cmd, badUsage("no trainer command: spotagent run [flags] -- COMMAND [ARGS...]"))
			}
			return runAgent(cmd, &o, args, false)
		},
	}
	fs := cmd.Flags()
	fs.SetInterspersed(false) // the trainer's flags are its own
	o.register(fs, false)
	fs.IntVar(&o.maxRestarts, "max-restarts", 0, "restart a trainer that exits non-zero on its own, from the newest checkpoint, up to N times")
	fs.BoolVar(&o.restoreSerial, "restore-serial", false, "restore first, then start the trainer (default: start it at once and restore meanwhile); a trainer that reads $SPOTAGENT_RESUME_DIR itself, without a client that speaks protocol 2, needs this")
	fs.StringVar(&o.signal, "signal", "", "for a trainer that does not speak the protocol: ask it to checkpoint with this signal (SIGUSR1 or SIGUSR2) and $SPOTAGENT_REQUEST_FILE; it answers by creating SPOTAGENT_DONE in the request's dir")
	inGroup(fs, groupTrainer, "max-restarts", "signal", "restore-serial")
	o.completions(cmd)
	completeWords(cmd, "signal", "SIGUSR1", "SIGUSR2")
	return cmd
}

func newSidecarCmd() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{
		Use:     "sidecar",
		Short:   "serve a trainer in another container (Kubernetes sidecar): no child",
		Example: "spotagent sidecar --store s3://my-bucket/runs/exp1 --socket /var/run/spotagent/agent.sock",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAgent(cmd, &o, nil, false)
		},
	}
	o.register(cmd.Flags(), false)
	noChild(cmd.Flags())
	o.completions(cmd)
	return cmd
}

func newNodeCmd() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{
		Use:     "node",
		Short:   "serve every trainer on the machine, one run per run id (Kubernetes DaemonSet)",
		Example: "spotagent node --store-prefix s3://my-bucket/runs/ --socket /var/run/spotagent/agent.sock",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAgent(cmd, &o, nil, true)
		},
	}
	fs := cmd.Flags()
	o.register(fs, true)
	noChild(fs)
	fs.IntVar(&o.concurrentCommits, "concurrent-commits", 2, "checkpoints uploaded at once across the node's runs; the rest wait, interruption checkpoints first, then the earliest deadline, then the smallest")
	inGroup(fs, groupStore, "concurrent-commits")
	o.completions(cmd)
	return cmd
}

// noChild says what --kill-after means to an agent without a child: a
// sidecar or node agent has no process group to signal. The flag stays
// (the shipped manifests set it beside --term-grace for the stop budget).
func noChild(fs *pflag.FlagSet) {
	fs.Lookup("kill-after").Usage = "run only: a sidecar or node agent has no child to signal, so this does nothing here (accepted so that one set of flags serves every mode); the trainer container's own stop is the kubelet's"
}

// runAgent wires the packages together and runs the agent. Every flag is
// checked first (exit 2); a bad store, socket or cloud setting then fails
// with one line (exit 1), before any trainer runs. With node set it serves
// every run on the machine (spotagent node).
func runAgent(cmd *cobra.Command, o *agentOptions, command []string, node bool) error {
	fail := func(err error) error { return failf(cmd, err) }
	if err := o.resolve(node); err != nil {
		return fail(err)
	}
	log, err := newLoggerTo(cmd.ErrOrStderr(), o.logFormat, o.logLevel) // stderr; a test's buffer in-process
	if err != nil {
		return fail(err)
	}
	defer func() { _ = log.Sync() }()
	defer idlegc.Start()() // a smaller heap while nothing is being checkpointed
	logConfig(log, cmd.Flags())
	if err := o.homelessCheckpointDir(log); err != nil {
		return fail(err)
	}
	sched, err := o.scheduler(log)
	if err != nil {
		return fail(err)
	}
	srvCfg, err := o.serverConfig(log)
	if err != nil {
		return fail(err)
	}
	if code, err := checkStart(command, node, srvCfg); err != nil {
		fail(err)
		return exit(code)
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ctx := context.Background()

	served, stopMetrics, err := serveMetrics(o.metricsAddr, log)
	if err != nil {
		return fail(err)
	}
	defer stopMetrics()
	var metrics supervisor.Metrics // none without --metrics-addr
	if served != nil {
		metrics = served.Agent()
		o.storeFlags.observer = served // every store's operations
	}
	st, err := o.storeFlags.openStore(ctx, o.store, log)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	src, ident, err := o.sourceFlags.open(ctx, log)
	if err != nil {
		return fail(err)
	}
	logMachine(log, ident)
	cfg := supervisor.Config{
		RunID: o.runID, CheckpointDir: o.checkpointDir, DefaultCheckpointDir: o.checkpointDirDefault, Store: st, Source: src, Identity: ident,
		Scheduler: sched, Server: srvCfg, Command: command, Keep: o.keep, TermGrace: o.termGrace,
		KillAfter: o.killAfter, MaxRestarts: o.maxRestarts, Margin: zeroAsNone(o.margin), OnRebalance: o.onRebalance,
		Signal: o.sig, Metrics: metrics, Log: log, FenceInterval: o.fenceInterval,
		Node: o.node, RestoreAll: o.restore == "all", LocalKeep: o.localKeep, LocalMaxBytes: o.localMaxBytes, Liveness: o.liveness(),
		PeerTier: o.peerTier(),
		// Only a trainer the agent starts: a sidecar's or node's trainer
		// starts on its own (docs/protocol.md).
		OverlapRestore: len(command) > 0 && !o.restoreSerial,
	}
	defer o.openFleet(ctx, &cfg, node, log)() // docs/fleet.md
	if node {
		cfg.UploadGate = commit.NewGate(o.concurrentCommits)
		err := nodemode.Run(ctx, nodemode.Config{
			StorePrefix: o.store, CheckpointRoot: o.checkpointDir, Source: src, Identity: ident, Server: srvCfg,
			OpenStore: func(ctx context.Context, uri string) (cloud.Store, error) {
				return o.storeFlags.openStore(ctx, uri, log)
			},
			NewScheduler: func() *schedule.Scheduler { s, _ := o.scheduler(log); return s },
			Run:          cfg, Log: log, PeerListen: o.peerListen,
		}, sigs)
		if err != nil {
			return fail(err)
		}
		return nil
	}
	cfg.Watch = o.watchCfg
	if w := cfg.Watch; w != nil && w.UID == nil && len(command) > 0 {
		// run: the trainer is the agent's child, of its user, whoever
		// owns DIR (docs/watch.md, "Whose files").
		euid := os.Geteuid()
		w.UID = &euid
	}
	code, err := supervisor.Run(ctx, cfg, sigs)
	if err != nil {
		fail(err)
		return exit(code) // 1, or 127/126 for a trainer command not found/not executable
	}
	return exit(code)
}

// checkStart refuses, before the store is opened, a start that would fail
// after it: a trainer command that cannot start (code 127 or 126, as
// shells) leaves no trace in the store, not even a file:// store's
// directory (supervisor.Run checks again); a refused socket (its
// directory, or a live agent on it: code 1) takes no lease, which would
// fence the live agent of the same store (review, item 1).
func checkStart(command []string, node bool, srv protocol.ServerConfig) (int, error) {
	if len(command) > 0 {
		if _, err := exec.LookPath(command[0]); err != nil {
			err = fmt.Errorf("start trainer: %w", err)
			return child.ExitCodeFromError(err), err
		}
	}
	if node {
		return 0, nil
	}
	if err := protocol.CheckStart(srv); err != nil {
		if errors.Is(err, protocol.ErrSocketInUse) {
			err = supervisor.SocketInUse(err)
		}
		return 1, fmt.Errorf("socket: %w", err)
	}
	return 0, nil
}

// logMachine logs the machine the agent runs on, with only the fields the
// metadata gave; without a metadata service it says what that means.
func logMachine(log *zap.Logger, id metadata.Identity) {
	if id.Cloud == metadata.CloudNone || id.Cloud == "" {
		log.Info("no cloud metadata service (--cloud none, or none answered): only SIGTERM and SIGINT announce an interruption, and the journal records no machine")
		return
	}
	fields := []zap.Field{zap.String("cloud", string(id.Cloud))}
	for _, f := range []struct{ k, v string }{{"instance_id", id.InstanceID}, {"instance_type", id.InstanceType},
		{"zone", id.Zone}, {"lifecycle", id.Lifecycle}} {
		if f.v != "" {
			fields = append(fields, zap.String(f.k, f.v))
		}
	}
	log.Info("machine", fields...)
}
