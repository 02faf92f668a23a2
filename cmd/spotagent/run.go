package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

func cmdRun(args []string) int {
	fs := newFlagSet("run")
	var o agentOptions
	o.register(fs, false)
	fs.IntVar(&o.maxRestarts, "max-restarts", 0, "restart a trainer that exits non-zero on its own, from the newest checkpoint, up to N times")
	fs.StringVar(&o.signal, "signal", "", "for a trainer that does not speak the protocol: ask it to checkpoint with this signal (SIGUSR1 or SIGUSR2) and $SPOTAGENT_REQUEST_FILE; it answers by creating SPOTAGENT_DONE in the request's dir")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: spotagent run [flags] -- COMMAND [ARGS...]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	command := fs.Args()
	if len(command) == 0 {
		fmt.Fprintln(os.Stderr, "spotagent run: no trainer command: spotagent run [flags] -- COMMAND [ARGS...]")
		return 2
	}
	return runAgent(fs, &o, command, false)
}

func cmdSidecar(args []string) int {
	fs := newFlagSet("sidecar")
	var o agentOptions
	o.register(fs, false)
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "spotagent sidecar: takes no command; the trainer runs in its own container")
		return 2
	}
	return runAgent(fs, &o, nil, false)
}

func cmdNode(args []string) int {
	fs := newFlagSet("node")
	var o agentOptions
	o.register(fs, true)
	fs.IntVar(&o.concurrentCommits, "concurrent-commits", 2, "checkpoints uploaded at once across the node's runs; the rest wait, interruption checkpoints first, then the earliest deadline, then the smallest")
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "spotagent node: takes no command; trainers connect to the socket")
		return 2
	}
	if o.store == "" {
		fmt.Fprintln(os.Stderr, "spotagent node: --store-prefix is required")
		return 2
	}
	if o.concurrentCommits < 1 {
		fmt.Fprintln(os.Stderr, "spotagent node: --concurrent-commits must be at least 1")
		return 2
	}
	return runAgent(fs, &o, nil, true)
}

// runAgent wires the packages together and runs the agent. A bad store,
// socket or cloud setting fails here with one line, before any trainer runs.
// With node set it serves every run on the machine (spotagent node).
func runAgent(fs *flag.FlagSet, o *agentOptions, command []string, node bool) int {
	name := strings.TrimPrefix(fs.Name(), "spotagent ")
	fail := func(err error) int { return failf(name, err) }
	if err := o.resolve(); err != nil {
		return fail(err)
	}
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return fail(err)
	}
	defer log.Sync()
	logConfig(log, fs)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ctx := context.Background()

	st, err := openStore(ctx, o.store, o.storeFlags, log)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	src, ident, err := o.sourceFlags.open(ctx, log)
	if err != nil {
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
	metrics, stopMetrics, err := serveMetrics(o.metricsAddr, log)
	if err != nil {
		return fail(err)
	}
	defer stopMetrics()
	log.Info("machine", zap.String("cloud", string(ident.Cloud)), zap.String("instance_id", ident.InstanceID),
		zap.String("instance_type", ident.InstanceType), zap.String("zone", ident.Zone), zap.String("lifecycle", ident.Lifecycle))
	cfg := supervisor.Config{
		RunID: o.runID, CheckpointDir: o.checkpointDir, Store: st, Source: src, Identity: ident,
		Scheduler: sched, Server: srvCfg, Command: command, Keep: o.keep, TermGrace: o.termGrace,
		KillAfter: o.killAfter, MaxRestarts: o.maxRestarts, Margin: o.margin, OnRebalance: o.onRebalance,
		Signal: o.sig, Metrics: metrics, Log: log, FenceInterval: o.fenceInterval,
		Node: o.node, RestoreAll: o.restore == "all",
	}
	if node {
		cfg.UploadGate = checkpoint.NewGate(o.concurrentCommits)
		err := supervisor.RunNode(ctx, supervisor.NodeConfig{
			StorePrefix: o.store, CheckpointRoot: o.checkpointDir, Source: src, Identity: ident, Server: srvCfg,
			OpenStore: func(ctx context.Context, uri string) (cloud.Store, error) {
				return openStore(ctx, uri, o.storeFlags, log)
			},
			NewScheduler: func() *checkpoint.Scheduler { s, _ := o.scheduler(log); return s },
			Run:          cfg, Log: log,
		}, sigs)
		if err != nil {
			return fail(err)
		}
		return 0
	}
	if cfg.Watch, err = o.watch.config(); err != nil {
		return fail(err)
	}
	code, err := supervisor.Run(ctx, cfg, sigs)
	if err != nil {
		fail(err)
		return code // 1, or 127/126 for a trainer command not found/not executable
	}
	return code
}
