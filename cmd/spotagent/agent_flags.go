package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// agentOptions are the flags shared by run, sidecar and node.
type agentOptions struct {
	store, runID, checkpointDir, socket, socketMode, allowUID string
	interval                                                  string
	minInterval, maxInterval                                  time.Duration
	interruptionRate                                          float64
	keep, maxRestarts, concurrentCommits, maxConns            int
	socketDefault                                             bool   // no --socket: the private default dir
	checkpointDirDefault                                      bool   // no --checkpoint-dir: the default cache
	checkpointDirNoHome                                       string // the default is not under a home directory: why
	termGrace, killAfter, margin                              time.Duration
	onRebalance                                               string
	signal                                                    string
	sig                                                       syscall.Signal
	metricsAddr                                               string
	storeFlags                                                storeOptions
	sourceFlags                                               sourceOptions
	logFormat, logLevel                                       string
	fenceInterval                                             time.Duration
	watch                                                     watchOptions            // run and sidecar (watch_flags.go)
	watchCfg                                                  *supervisor.WatchConfig // from watch, by resolve
	nodeRank, restore                                         string                  // multi-node jobs (docs/distributed.md)
	restoreSerial                                             bool                    // run: restore before the trainer starts
	node                                                      string                  // the part name nodeRank gives
	fleet                                                     string                  // --fleet (fleet_store.go)
	localKeep                                                 int                     // the local tier (#38): copies kept, 0 off
	localMaxBytes                                             int64
	peerTimeout                                               time.Duration // liveness heartbeats (pkg/liveness)
	peerListen, peerAdvertise                                 string
	peerRestore                                               bool // the peer tier (pkg/checkpoint/peertier)
	replicas                                                  int
	peerWait                                                  time.Duration // --peer-wait
}

func (o *agentOptions) register(fs *pflag.FlagSet, node bool) {
	if node {
		fs.StringVar(&o.store, "store-prefix", "", "each run's store is this prefix + its run id: s3://bucket/runs, gs://bucket/runs, az://container/runs, file:///dir")
		fs.StringVar(&o.checkpointDir, "checkpoint-root", "/var/lib/spotagent", "local directory; each run gets CHECKPOINT-ROOT/RUN-ID")
		o.runID = "node"
		fs.DurationVar(&o.peerTimeout, "peer-timeout", liveness.DefaultTimeout, "a neighbour node's agent of a hosted multi-node run silent this long is a lost node (peer-lost in the run's directory: its pod ends its ranks, exit 75): at least 2s, or 0 for no heartbeats")
		fs.StringVar(&o.peerListen, "peer-listen", ":0", "UDP address of the one socket every hosted multi-node run's heartbeats arrive on (e.g. :29450); with --peer-restore, also the TCP address the peer tier listens on")
		fs.StringVar(&o.peerAdvertise, "peer-advertise", "", "comma-separated hosts the other nodes reach this one at (default: every address of the machine)")
		fs.BoolVar(&o.peerRestore, "peer-restore", false, "every hosted multi-node run serves this machine's local copies (--local-keep) to its job's other agents on one TCP listener at --peer-listen's address, and restores from theirs before the store")
		fs.IntVar(&o.replicas, "replicas", 0, "with --peer-restore: 1 also keeps, for each hosted multi-node run, a copy of another node's part (one in another zone, else of another instance type, else node K+1's) after each periodic commit, within --local-max-bytes; 0: none")
	} else {
		fs.StringVar(&o.store, "store", "", "where checkpoints go: s3://bucket/prefix, gs://bucket/prefix, az://container[@account]/prefix, file:///dir or a path")
		fs.StringVar(&o.runID, "run-id", "", "run name, recorded in manifests and the journal (default: the store's last path element)")
		fs.StringVar(&o.checkpointDir, "checkpoint-dir", "", "local directory for checkpoints in progress and restores (default: ~/.cache/spotagent/RUN-ID; without a home directory $TMPDIR/spotagent-cache-UID/RUN-ID)")
		o.watch.register(fs)
		fs.StringVar(&o.nodeRank, "node-rank", "", "this machine's node rank in a multi-node job (torchrun's --node_rank; default $SPOTAGENT_NODE_RANK): commit this node's part of each job checkpoint")
		fs.DurationVar(&o.peerTimeout, "peer-timeout", liveness.DefaultTimeout, "with --node-rank: a neighbour node's agent silent this long is a lost node (its ranks are ended, exit 75): at least 2s, or 0 for no heartbeats")
		fs.StringVar(&o.peerListen, "peer-listen", ":0", "with --node-rank: UDP address the other nodes' heartbeats arrive on; with --peer-restore, also the TCP address the peer tier listens on")
		fs.StringVar(&o.peerAdvertise, "peer-advertise", "", "with --node-rank: comma-separated hosts the other nodes reach this one at (default: every address of the machine)")
		fs.IntVar(&o.replicas, "replicas", 0, "with --peer-restore: 1 also keeps a copy of another node's part (one in another zone, else of another instance type, else node K+1's; copied from it after each periodic commit, within --local-max-bytes) so that sharded parts have a copy on another machine; 0: none")
		fs.BoolVar(&o.peerRestore, "peer-restore", false, "with --node-rank: serve this machine's local copies (--local-keep) to the job's other agents over TCP on --peer-listen's address, and restore from theirs before the store (files of the same size and digest: data-parallel replicas; every file checked against the manifest's BLAKE3 digest)")
	}
	fs.DurationVar(&o.peerWait, "peer-wait", peertier.DefaultPeerWait, "with --peer-restore: how long a restore waits, in all, for peers whose record holds the checkpoint but whose agent does not answer yet (every node of the job restarting at once), before it reads their files from the store; 0: no wait")
	fs.StringVar(&o.restore, "restore", "own", "what a node of a multi-node job restores: own (its own part) or all (every part: a changed topology)")
	fs.StringVar(&o.socket, "socket", "", "Unix socket the trainer connects to (default: $XDG_RUNTIME_DIR/spotagent/RUN-ID.sock, else $TMPDIR/spotagent-UID/RUN-ID.sock, in a 0700 directory of the agent's own)")
	fs.StringVar(&o.socketMode, "socket-mode", "0600", "file mode of the socket")
	fs.StringVar(&o.allowUID, "allow-uid", "", "comma-separated uids allowed to connect besides the agent's own and root")
	maxConns := protocol.DefaultMaxConns
	if node {
		maxConns = protocol.DefaultNodeMaxConns
	}
	fs.IntVar(&o.maxConns, "max-connections", maxConns, "open socket connections at most (at most a quarter of the open-file limit); more are refused")
	fs.StringVar(&o.interval, "interval", "auto", "periodic checkpoint interval: auto (Young/Daly) or a duration such as 15m")
	fs.DurationVar(&o.minInterval, "min-interval", schedule.DefaultMinInterval, "shortest adaptive interval")
	fs.DurationVar(&o.maxInterval, "max-interval", schedule.DefaultMaxInterval, "longest adaptive interval")
	fs.Float64Var(&o.interruptionRate, "interruption-rate", schedule.DefaultInterruptionRate, "prior interruptions per hour, for the adaptive interval")
	fs.IntVar(&o.keep, "keep", 3, "committed checkpoints kept in the store")
	fs.IntVar(&o.localKeep, "local-keep", 1, "committed checkpoints kept on this machine, in the checkpoint directory, for a restart here to restore from without the store (every file checked against the manifest's BLAKE3 digest before it is used); 0: none")
	fs.Int64Var(&o.localMaxBytes, "local-max-bytes", 0, "bound on the bytes --local-keep keeps; a larger checkpoint is not kept (0: no bound)")
	fs.DurationVar(&o.termGrace, "term-grace", 25*time.Second, "deadline of the checkpoint taken on SIGTERM/SIGINT")
	fs.DurationVar(&o.killAfter, "kill-after", 5*time.Second, "SIGTERM to SIGKILL for the trainer's process group")
	fs.DurationVar(&o.margin, "margin", schedule.DefaultMargin, "safety margin kept before a notice deadline (0: none)")
	fs.StringVar(&o.onRebalance, "on-rebalance", "checkpoint", "what a rebalance recommendation does: checkpoint or none")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address (off when empty)")
	fs.DurationVar(&o.fenceInterval, "fence-interval", 30*time.Second, "how often to check that no newer agent took the run over (one List of leases/ in the store); 0 turns fencing off")
	fs.StringVar(&o.fleet, "fleet", "", "the fleet's store, where this agent records its sessions for the fleet view and reads its interruption prior: a `URI` every run of the fleet names, such as s3://bucket/runs; default: the run's own store (node: --store-prefix); off: none")
	o.storeFlags.register(fs)
	o.sourceFlags.register(fs)
	fs.StringVar(&o.logFormat, "log-format", "console", "log format: console or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")

	if node {
		inGroup(fs, groupRequired, "store-prefix")
		inGroup(fs, groupMultiNode, "peer-timeout", "peer-listen", "peer-advertise", "peer-restore", "replicas", "peer-wait")
	} else {
		inGroup(fs, groupRequired, "store")
		inGroup(fs, groupMultiNode, "node-rank", "peer-timeout", "peer-listen", "peer-advertise", "peer-restore", "replicas", "peer-wait")
	}
	inGroup(fs, groupMultiNode, "restore")
	inGroup(fs, groupNotices, "margin", "on-rebalance")
	inGroup(fs, groupSchedule, "interval", "min-interval", "max-interval", "interruption-rate", "keep", "local-keep", "local-max-bytes", "fleet")
	inGroup(fs, groupTrainer, "term-grace", "kill-after")
	inGroup(fs, groupSecurity, "socket", "socket-mode", "allow-uid", "max-connections", "fence-interval")
	inGroup(fs, groupOutput, "metrics-addr", "log-format", "log-level")
}

// completions offers the fixed values of the agent's flags to the shell.
func (o *agentOptions) completions(cmd *cobra.Command) {
	completeWords(cmd, "interval", "auto", "5m", "15m", "30m")
	completeWords(cmd, "on-rebalance", "checkpoint", "none")
	completeWords(cmd, "restore", "own", "all")
	completeWords(cmd, "cloud", clouds...)
	completeWords(cmd, "log-format", "console", "json")
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
}

// resolve fills the defaults that depend on other flags and checks every
// flag, so that a bad value fails (exit 2) before the store or the network
// is touched. The errors are usageErrors.
func (o *agentOptions) resolve(node bool) error {
	if err := o.check(node); err != nil {
		return usageError{err}
	}
	if o.checkpointDir == "" {
		var base string
		base, o.checkpointDirNoHome = checkpointBase()
		o.checkpointDir, o.checkpointDirDefault = filepath.Join(base, o.runID), true
	}
	abs, err := filepath.Abs(o.checkpointDir)
	if err != nil {
		return err
	}
	o.checkpointDir = abs
	if o.socket == "" {
		o.socket, o.socketDefault = defaultSocket(o.runID), true
	}
	if o.fenceInterval == 0 {
		o.fenceInterval = -1 // supervisor.Config: no lease
	}
	return nil
}

// checkpointBase is where the default checkpoint directories go:
// $XDG_CACHE_HOME/spotagent, else $HOME/.cache/spotagent when that home can
// hold it (its .cache exists, or the home is writable and not /). With no
// HOME, or one that does not exist or cannot be written (a service user's
// HOME=/nonexistent, which the agent must not create, even as root; HOME=/
// of nobody or a DynamicUser= service), it is $TMPDIR/spotagent-cache-UID,
// which privateBase makes this user's alone, and noHome says why.
func checkpointBase() (base, noHome string) {
	if x := os.Getenv("XDG_CACHE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "spotagent"), ""
	}
	home := os.Getenv("HOME")
	switch fi, err := os.Stat(home); {
	case home == "":
		noHome = "HOME is not set"
	case err != nil || !fi.IsDir():
		noHome = "HOME " + home + " is not a directory"
	case isDir(filepath.Join(home, ".cache")) || (home != "/" && unix.Access(home, unix.W_OK) == nil):
		return filepath.Join(home, ".cache", "spotagent"), ""
	default:
		noHome = "HOME " + home + " cannot hold a .cache directory"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("spotagent-cache-%d", os.Geteuid())), noHome
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// homelessCheckpointDir: when the default checkpoint directory is in the
// temporary directory (no home to hold it), its base must be this user's
// alone (privateBase), and the log says where it is and why.
func (o *agentOptions) homelessCheckpointDir(log *zap.Logger) error {
	if o.checkpointDirNoHome == "" {
		return nil
	}
	if err := privateBase(filepath.Dir(o.checkpointDir)); err != nil {
		return err
	}
	log.Warn("no home directory for the default checkpoint directory: it is in the temporary directory, which may be memory; set --checkpoint-dir to a disk with room for a checkpoint",
		zap.String("why", o.checkpointDirNoHome), zap.String("checkpoint_dir", o.checkpointDir))
	return nil
}

// privateBase makes dir (the default checkpoint directories' base in the
// temporary directory) if it is missing, and refuses it unless it is a
// directory of this user's that nobody else may enter: in a directory
// everyone may write, another user could have made it first, and could
// then swap the run's area inside it for one of theirs.
func privateBase(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		uid := -1
		if ok {
			uid = int(st.Uid)
		}
		return fmt.Errorf("checkpoint dir: %s: owned by uid %d (mode %s), not a private directory of uid %d: refused; remove it or set --checkpoint-dir",
			dir, uid, fi.Mode(), os.Geteuid())
	}
	return nil
}

// checkStoreURI: a store URI that cannot be opened is a usage error (exit
// 2), said before anything is logged as the effective configuration.
func checkStoreURI(uri string, node bool) error {
	err := all.CheckURI(uri)
	if err == nil {
		return nil
	}
	flag := "--store"
	if node {
		flag = "--store-prefix"
	}
	if l := strings.ToLower(uri); strings.HasPrefix(l, "http://") || strings.HasPrefix(l, "https://") {
		return fmt.Errorf("%s: %w (an S3-compatible server: s3://BUCKET/PREFIX with --s3-endpoint URL)", flag, err)
	}
	return fmt.Errorf("%s: %w", flag, err)
}

func (o *agentOptions) check(node bool) error {
	if o.store == "" {
		if node {
			return errors.New("--store-prefix is required (s3://bucket/runs, gs://bucket/runs, az://container/runs or file:///dir)")
		}
		return errors.New("--store is required (s3://bucket/prefix, gs://bucket/prefix, az://container[@account]/prefix, file:///dir or a path)")
	}
	if err := checkStoreURI(o.store, node); err != nil {
		return err
	}
	if o.runID == "" {
		o.runID = defaultRunID(o.store)
	}
	if !checkpoint.ValidID(o.runID) {
		return fmt.Errorf("--run-id %q: use letters, digits, '-', '_' and '.'", o.runID)
	}
	if err := o.sourceFlags.check(); err != nil {
		return err
	}
	if _, err := parseInterval(o.interval); err != nil {
		return err
	}
	if err := checkSchedule(o.minInterval, o.maxInterval, o.interruptionRate, o.margin); err != nil {
		return err
	}
	if o.termGrace <= 0 {
		return fmt.Errorf("--term-grace %s: want a positive duration", o.termGrace)
	}
	if o.killAfter <= 0 {
		return fmt.Errorf("--kill-after %s: want a positive duration (the trainer's time to exit after SIGTERM)", o.killAfter)
	}
	if o.maxConns < 1 {
		return fmt.Errorf("--max-connections must be at least 1")
	}
	if node && o.concurrentCommits < 1 {
		return fmt.Errorf("--concurrent-commits must be at least 1")
	}
	if o.onRebalance != "checkpoint" && o.onRebalance != "none" {
		return fmt.Errorf("--on-rebalance: want checkpoint or none, got %q", o.onRebalance)
	}
	if o.fenceInterval < 0 {
		return fmt.Errorf("--fence-interval must not be negative")
	}
	if o.keep < 1 {
		return fmt.Errorf("--keep must be at least 1")
	}
	if o.localKeep < 0 || o.localMaxBytes < 0 {
		return fmt.Errorf("--local-keep and --local-max-bytes must not be negative")
	}
	if o.fleet != "" && o.fleet != fleetOff {
		if err := all.CheckURI(o.fleet); err != nil {
			return fmt.Errorf("--fleet: %w (or off)", err)
		}
	}
	if o.maxRestarts < 0 {
		return fmt.Errorf("--max-restarts must not be negative")
	}
	if err := o.checkPeers(node); err != nil {
		return err
	}
	if o.restore != "own" && o.restore != "all" {
		return fmt.Errorf("--restore: want own or all, got %q", o.restore)
	}
	if o.nodeRank == "" {
		o.nodeRank = os.Getenv("SPOTAGENT_NODE_RANK")
	}
	if o.nodeRank != "" {
		k, err := supervisor.ParseNodeRank(o.nodeRank)
		if err != nil {
			return fmt.Errorf("--node-rank: %w", err)
		}
		o.node = supervisor.NodePart(k)
		if o.watch.dir != "" {
			return fmt.Errorf("--node-rank and --watch: a multi-node job needs the protocol (its ranks agree on the step); --watch is for one trainer")
		}
	}
	if o.signal != "" {
		sig, err := sigbridge.Parse(o.signal)
		if err != nil {
			return fmt.Errorf("--signal: %w", err)
		}
		o.sig = sig
	}
	if _, err := o.serverConfig(nil); err != nil {
		return err
	}
	if !node { // node has no watch flags
		c, err := o.watch.config()
		if err != nil {
			return err
		}
		o.watchCfg = c
	}
	if _, err := newLogger(o.logFormat, o.logLevel); err != nil {
		return err
	}
	return nil
}

// defaultRunID is the last element of the store URI's path.
func defaultRunID(store string) string {
	s := strings.TrimRight(store, "/")
	if i := strings.LastIndex(s, "/"); i >= 0 {
		s = s[i+1:]
	}
	if !checkpoint.ValidID(s) {
		return "run"
	}
	return s
}

func (o *agentOptions) scheduler(log *zap.Logger) (*schedule.Scheduler, error) {
	cfg := schedule.SchedulerConfig{Min: o.minInterval, Max: o.maxInterval, InterruptionRate: o.interruptionRate, Log: log}
	var err error
	if cfg.Fixed, err = parseInterval(o.interval); err != nil {
		return nil, err
	}
	return schedule.NewScheduler(cfg), nil
}

// checkSchedule checks the flags of the adaptive interval and the notice
// margin (run, sidecar, node and report's advice).
func checkSchedule(minIv, maxIv time.Duration, rate float64, margin time.Duration) error {
	switch {
	case minIv <= 0:
		return fmt.Errorf("--min-interval %s: want a positive duration", minIv)
	case maxIv <= 0:
		return fmt.Errorf("--max-interval %s: want a positive duration", maxIv)
	case minIv > maxIv:
		return fmt.Errorf("--min-interval %s is longer than --max-interval %s", minIv, maxIv)
	}
	if err := nonNegative("--interruption-rate", rate); err != nil {
		return err
	}
	if margin < 0 {
		return fmt.Errorf("--margin %s: must not be negative", margin)
	}
	return nil
}

// zeroAsNone is a duration flag's 0 (none: no wait, no margin) as the
// configurations take it, where 0 is the default and a negative value none.
func zeroAsNone(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// nonNegative checks a number flag: finite and >= 0.
func nonNegative(flag string, v float64) error {
	if !(v >= 0) || math.IsInf(v, 1) {
		return fmt.Errorf("%s %v: want a number >= 0", flag, v)
	}
	return nil
}

// parseInterval parses --interval (of run, sidecar, node and report): 0
// for auto, else a positive duration.
func parseInterval(s string) (time.Duration, error) {
	if s == "auto" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--interval: want auto or a positive duration, got %q", s)
	}
	return d, nil
}

func (o *agentOptions) serverConfig(log *zap.Logger) (protocol.ServerConfig, error) {
	mode, err := strconv.ParseUint(o.socketMode, 8, 32)
	if err != nil || mode > 0o777 {
		return protocol.ServerConfig{}, fmt.Errorf("--socket-mode: want an octal mode such as 0600, got %q", o.socketMode)
	}
	var uids []int
	for _, s := range strings.Split(o.allowUID, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		u, err := strconv.Atoi(s)
		if err != nil || u < 0 {
			return protocol.ServerConfig{}, fmt.Errorf("--allow-uid: bad uid %q", s)
		}
		uids = append(uids, u)
	}
	return protocol.ServerConfig{Path: o.socket, PrivateDir: o.socketDefault, Mode: os.FileMode(mode), AllowUIDs: uids,
		MaxConns: o.maxConns, Log: log}, nil
}

// logConfig logs the effective configuration once at start: at info level
// the flags set on the command line or by the environment, at debug level
// every flag.
func logConfig(log *zap.Logger, fs *pflag.FlagSet) {
	all := log.Core().Enabled(zap.DebugLevel)
	var fields []zap.Field
	fs.VisitAll(func(f *pflag.Flag) {
		if skipEnv(f) || !all && !isSet(fs, f.Name) {
			return
		}
		fields = append(fields, zap.String(f.Name, withoutPassword(f.Value.String())))
	})
	if all {
		log.Debug("effective configuration", fields...)
		return
	}
	fields = append(fields, zap.String("others", "defaults (--log-level debug logs every flag)"))
	log.Info("effective configuration", fields...)
}

// withoutPassword is a flag's value as logged: a URL's password (an
// endpoint such as --s3-endpoint http://user:secret@host) replaced by
// "xxxxx", the value itself otherwise.
func withoutPassword(v string) string {
	if !strings.Contains(v, "@") {
		return v
	}
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			return u.Redacted()
		}
	}
	return v
}

// minPeerTimeout is the shortest --peer-timeout accepted. A heartbeat
// goes every timeout/8 and a neighbour is lost after a whole timeout of
// silence: below 2 s (a heartbeat every 250 ms) a GC pause, a loaded
// machine or a busy network path ends healthy jobs with exit 75, again at
// every restart.
const minPeerTimeout = 2 * time.Second

// checkPeers checks the heartbeat flags (docs/distributed.md): a timeout
// of 0 (off) or at least minPeerTimeout, a --peer-listen host:port with a
// port the kernel can bind, hosts without ports in --peer-advertise, and
// none of them without --node-rank (but in node mode), where nothing reads
// them.
func (o *agentOptions) checkPeers(node bool) error {
	if o.peerTimeout < 0 {
		return fmt.Errorf("--peer-timeout must not be negative")
	}
	if o.peerTimeout > 0 && o.peerTimeout < minPeerTimeout {
		return fmt.Errorf("--peer-timeout %s: want at least %s (a heartbeat every eighth of it; shorter ends healthy jobs on a GC pause), or 0 for no heartbeats", o.peerTimeout, minPeerTimeout)
	}
	host, port, err := net.SplitHostPort(o.peerListen)
	if err != nil {
		return fmt.Errorf("--peer-listen %q: want HOST:PORT or :PORT (e.g. :29450): %w", o.peerListen, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil || strings.ContainsAny(host, " /@") {
		return fmt.Errorf("--peer-listen %q: want HOST:PORT or :PORT with a port from 0 to 65535 (e.g. :29450)", o.peerListen)
	}
	for _, h := range strings.Split(o.peerAdvertise, ",") {
		h = strings.TrimSpace(h)
		if h == "" || net.ParseIP(h) != nil {
			continue
		}
		if strings.ContainsAny(h, ":/@ ") {
			return fmt.Errorf("--peer-advertise %q: want comma-separated hosts (IPs or names) without a port; the port is --peer-listen's", o.peerAdvertise)
		}
	}
	if !node && o.nodeRank == "" && os.Getenv("SPOTAGENT_NODE_RANK") == "" &&
		(o.peerTimeout != liveness.DefaultTimeout || o.peerListen != ":0" || o.peerAdvertise != "") {
		return fmt.Errorf("--peer-timeout, --peer-listen and --peer-advertise need --node-rank (or SPOTAGENT_NODE_RANK): only the nodes of a multi-node job send heartbeats")
	}
	if !node && o.peerRestore && o.nodeRank == "" && os.Getenv("SPOTAGENT_NODE_RANK") == "" {
		return fmt.Errorf("--peer-restore needs --node-rank (or SPOTAGENT_NODE_RANK): only the nodes of a multi-node job have peers")
	}
	if o.replicas < 0 || o.replicas > 1 {
		return fmt.Errorf("--replicas %d: want 0 or 1", o.replicas)
	}
	if o.peerWait < 0 {
		return fmt.Errorf("--peer-wait must not be negative (0: no wait)")
	}
	if o.peerWait != peertier.DefaultPeerWait && !o.peerRestore {
		return fmt.Errorf("--peer-wait needs --peer-restore: it bounds the wait for peers that restore asks")
	}
	if o.replicas > 0 && !o.peerRestore {
		return fmt.Errorf("--replicas needs --peer-restore: the copies are served to the other nodes by the peer tier")
	}
	if o.replicas > 0 && o.localKeep < 1 {
		return fmt.Errorf("--replicas needs --local-keep 1 or more: the copies are kept in the local tier")
	}
	if o.peerRestore && o.watch.dir != "" {
		return fmt.Errorf("--peer-restore does not work with --watch: the watched directory is its own local copy, and watch mode keeps no local tier to serve")
	}
	return nil
}

// peerTier is the peer tier's configuration: --peer-listen's address over
// TCP, --peer-advertise's hosts.
func (o *agentOptions) peerTier() supervisor.PeerTierConfig {
	if !o.peerRestore {
		return supervisor.PeerTierConfig{}
	}
	c := supervisor.PeerTierConfig{Enabled: true, Listen: o.peerListen, Replicas: o.replicas, PeerWait: zeroAsNone(o.peerWait)}
	for _, h := range strings.Split(o.peerAdvertise, ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.Advertise = append(c.Advertise, h)
		}
	}
	return c
}

// liveness is the heartbeats' configuration (pkg/liveness): a heartbeat
// every twentieth of the timeout (100 ms at the default 2 s: a 1 s pause
// or loss burst leaves ten heartbeats of margin).
func (o *agentOptions) liveness() liveness.Config {
	if o.peerTimeout == 0 {
		return liveness.Config{Timeout: -1}
	}
	c := liveness.Config{Listen: o.peerListen, Timeout: o.peerTimeout, Interval: o.peerTimeout / 20}
	for _, h := range strings.Split(o.peerAdvertise, ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.Advertise = append(c.Advertise, h)
		}
	}
	return c
}
