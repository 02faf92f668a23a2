package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/supervisor"
)

func init() {
	commands["run"] = command{cmdRun, "run a trainer: restore, checkpoint on notices and periodically, commit to the store"}
	commands["sidecar"] = command{cmdSidecar, "serve a trainer in another container (Kubernetes sidecar): no child"}
}

func cmdRun(args []string) int {
	fs := newFlagSet("run")
	var o agentOptions
	o.register(fs, true)
	fs.IntVar(&o.maxRestarts, "max-restarts", 0, "restart a trainer that exits non-zero on its own, from the newest checkpoint, up to N times")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: spotagent run [flags] -- COMMAND [ARGS...]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	command := fs.Args()
	if len(command) == 0 {
		fmt.Fprintln(os.Stderr, "spotagent run: no trainer command: spotagent run [flags] -- COMMAND [ARGS...]")
		return 2
	}
	return runAgent(fs, &o, command)
}

func cmdSidecar(args []string) int {
	fs := newFlagSet("sidecar")
	var o agentOptions
	o.register(fs, true)
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "spotagent sidecar: takes no command; the trainer runs in its own container")
		return 2
	}
	return runAgent(fs, &o, nil)
}

// runAgent wires the packages together and runs the agent. A bad store,
// socket or cloud setting fails here with one line, before any trainer runs.
func runAgent(fs *flag.FlagSet, o *agentOptions, command []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "spotagent %s: %v\n", fs.Name()[len("spotagent "):], err)
		return 1
	}
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
	code, err := supervisor.Run(ctx, supervisor.Config{
		RunID: o.runID, CheckpointDir: o.checkpointDir, Store: st, Source: src, Identity: ident,
		Scheduler: sched, Server: srvCfg, Command: command, Keep: o.keep, TermGrace: o.termGrace,
		KillAfter: o.killAfter, MaxRestarts: o.maxRestarts, Margin: o.margin, OnRebalance: o.onRebalance,
		Metrics: metrics, Log: log,
	}, sigs)
	if err != nil {
		return fail(err)
	}
	return code
}
