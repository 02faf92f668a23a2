package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// Config wires one agent: a run, its store, its trainer.
type Config struct {
	RunID         string
	CheckpointDir string // local scratch: requests get <dir>/<id>, restores go to <dir>/restore
	Store         cloud.Store
	Source        metadata.Source // nil: no cloud notices
	Identity      metadata.Identity
	Scheduler     *checkpoint.Scheduler
	Server        ServerConfig

	Command     []string      // the trainer; empty runs without a child (sidecar)
	Keep        int           // checkpoints kept by retention (default 3)
	TermGrace   time.Duration // deadline of the shutdown checkpoint (default 25s)
	KillAfter   time.Duration // SIGTERM → SIGKILL for the child (default 5s)
	MaxRestarts int           // restarts of a child that failed on its own
	Margin      time.Duration // safety margin kept before a notice deadline (default 5s)
	OnRebalance string        // "checkpoint" (default) or "none"
	// Signal, when set, is the fallback for a trainer that does not speak
	// the protocol: each checkpoint request is written to RequestFile and
	// the child is sent this signal; DoneMarker in the dir answers it.
	Signal syscall.Signal
	// EndWhenIdle ends a run without a child once a trainer has come and
	// gone and nothing is uploading (node mode).
	EndWhenIdle bool
	// UploadGate, shared by the runs of a node agent, lets their commits
	// upload a few at a time, the most urgent first (nil: no gate).
	UploadGate *checkpoint.Gate
	// RequestTimeout bounds how long a periodic request may go unanswered
	// before it is dropped (default 10m).
	RequestTimeout time.Duration
	// FenceInterval is how often the session's lease is checked for a
	// newer session (agent_fence.go); 0: 30s, < 0: no lease, no fencing.
	FenceInterval time.Duration
	// Watch, when set, is zero-code mode (agent_watch.go).
	Watch *WatchConfig

	Metrics Metrics // nil: none
	Log     *zap.Logger
}

func (c *Config) defaults() {
	if c.Keep <= 0 {
		c.Keep = 3
	}
	if c.TermGrace <= 0 {
		c.TermGrace = 25 * time.Second
	}
	if c.KillAfter <= 0 {
		c.KillAfter = 5 * time.Second
	}
	if c.Margin <= 0 {
		c.Margin = 5 * time.Second
	}
	if c.OnRebalance == "" {
		c.OnRebalance = "checkpoint"
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.Scheduler == nil {
		c.Scheduler = checkpoint.NewScheduler(checkpoint.SchedulerConfig{Log: c.Log})
	}
}

// newID returns a fresh checkpoint id: unique across agents and restarts.
func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// restoreDir is where restores go, inside the checkpoint directory.
func (a *Agent) restoreDir() string { return filepath.Join(a.cfg.CheckpointDir, "restore") }

// restore copies the newest committed checkpoint into the restore area and
// returns the resume information (nil when starting fresh).
func (a *Agent) restore(ctx context.Context) (*Resume, error) {
	if a.watch != nil {
		return a.restoreWatch(ctx) // agent_watch.go
	}
	restoreDir := a.restoreDir()
	start := time.Now()
	r, err := checkpoint.Restore(ctx, a.cfg.Store, restoreDir, checkpoint.RestoreOptions{Log: a.log, MaxEpoch: a.epoch()})
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		a.log.Info("no committed checkpoint: starting fresh", zap.String("store", a.cfg.Store.URI("")))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// A local copy of the manifest, beside (not inside) the checkpoint's
	// directory: SPOTAGENT_RESUME_MANIFEST points at it.
	manifest := r.Dir + ".manifest.json"
	if b, err := json.MarshalIndent(r.Manifest, "", "  "); err == nil {
		if err := os.WriteFile(manifest, b, 0o600); err != nil {
			a.log.Warn("could not write the local manifest copy", zap.Error(err))
		}
	}
	// Older restores are of no further use.
	if ents, err := os.ReadDir(restoreDir); err == nil {
		for _, e := range ents {
			if p := filepath.Join(restoreDir, e.Name()); p != r.Dir && p != manifest {
				os.RemoveAll(p)
			}
		}
	}
	a.log.Info("restored checkpoint", zap.Int64("step", r.Manifest.Step), zap.String("id", r.Manifest.ID),
		zap.String("dir", r.Dir), zap.Int64("bytes", r.Bytes), zap.Duration("took", r.Took), zap.Int("skipped", len(r.Skipped)))
	a.cfg.Metrics.Restored(r.Bytes, time.Since(start))
	a.journalAsync(func(j *checkpoint.Journal) {
		j.Restores = append(j.Restores, checkpoint.RestoreEntry{
			At: start.UTC(), CheckpointID: r.Manifest.ID, Step: r.Manifest.Step, Manifest: r.Key,
			Bytes: r.Bytes, Seconds: r.Took.Seconds(), Skipped: r.Skipped,
		})
	})
	a.lastCommit = committedCheckpoint{id: r.Manifest.ID, step: r.Manifest.Step, at: r.Manifest.Created, bytes: r.Bytes}
	return &Resume{Dir: r.Dir, Step: r.Manifest.Step, ID: r.Manifest.ID, Manifest: manifest, Metadata: r.Manifest.Metadata}, nil
}

// cleanup removes what a crashed agent left behind: the store's temp files
// or incomplete multipart uploads, and local checkpoint directories that no
// trainer will answer for any more. A sidecar leaves local directories
// alone: its trainer may still be running and own them.
func (a *Agent) cleanup(ctx context.Context) {
	if c, ok := a.cfg.Store.(cloud.Cleaner); ok {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := c.Cleanup(cctx)
		cancel()
		switch {
		case err != nil:
			a.log.Warn("store cleanup failed", zap.Error(err))
		case n > 0:
			a.log.Info("store cleanup: removed what an earlier crash left", zap.Int("objects", n))
		}
	}
	restoreDir := a.restoreDir()
	if ents, err := os.ReadDir(restoreDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".partial-") {
				os.RemoveAll(filepath.Join(restoreDir, e.Name()))
			}
		}
	}
	if len(a.cfg.Command) == 0 {
		return
	}
	ents, err := os.ReadDir(a.cfg.CheckpointDir)
	if err != nil {
		return
	}
	n := 0
	for _, e := range ents {
		p := filepath.Join(a.cfg.CheckpointDir, e.Name())
		if e.IsDir() && e.Name() != "restore" && !strings.HasPrefix(a.cfg.Server.Path, p+string(filepath.Separator)) {
			if os.RemoveAll(p) == nil {
				n++
			}
		}
	}
	if n > 0 {
		a.log.Info("removed checkpoint directories an earlier run left", zap.Int("dirs", n))
	}
}

// childEnv is the trainer's environment.
func (a *Agent) childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPOTAGENT_SOCKET=") { // set below, or withheld
			env = append(env, kv)
		}
	}
	env = append(env,
		"SPOTAGENT_RUN_ID="+a.cfg.RunID,
		"SPOTAGENT_CHECKPOINT_DIR="+a.cfg.CheckpointDir,
	)
	if a.cfg.Signal == 0 {
		env = append(env, "SPOTAGENT_SOCKET="+a.cfg.Server.Path)
	} else {
		// No socket: the bridge is the trainer's one voice; a client
		// library in the child runs as if there were no agent.
		env = append(env,
			"SPOTAGENT_SIGNAL="+signalName(a.cfg.Signal),
			"SPOTAGENT_REQUEST_FILE="+filepath.Join(a.cfg.CheckpointDir, RequestFile),
			"SPOTAGENT_DONE_MARKER="+DoneMarker,
		)
	}
	if r := a.resume; r != nil {
		env = append(env,
			"SPOTAGENT_RESUME_DIR="+r.Dir,
			"SPOTAGENT_RESUME_STEP="+strconv.FormatInt(r.Step, 10),
			"SPOTAGENT_RESUME_MANIFEST="+r.Manifest,
		)
	}
	return env
}

// signalNotice turns SIGTERM/SIGINT into a shutdown notice.
func signalNotice(sig os.Signal, grace time.Duration) metadata.Notice {
	now := time.Now()
	name := sig.String()
	if s, ok := sig.(syscall.Signal); ok && s == syscall.SIGTERM {
		name = "SIGTERM"
	}
	return metadata.Notice{Cloud: metadata.CloudSignal, Kind: metadata.KindTermination, ID: "signal-" + name,
		Deadline: now.Add(grace), Detected: now, Action: name}
}
