package localdirs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/localtier"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// localDirs are the agent's handles on its local directories: every
// operation below the checkpoint directory goes through them, never by
// path, so that a trainer swapping a directory for a symlink cannot
// redirect a write or a delete.
type localDirs struct {
	root     *os.Root // --checkpoint-dir
	area     *os.Root // root/areaName
	path     string   // --checkpoint-dir, as given
	areaName string
	areaPath string
	tier     *localtier.Tier // this machine's copies (openTier); nil: off
	peer     *peertier.Node  // the other nodes' copies (agent_peertier.go); nil: off
}

// exitFileSays is what the ranks wrote to the exit file, trimmed ("" when
// nothing). The trainer can replace the file: it is opened without
// blocking (a FIFO), a user-named path without following a symlink, and
// only a few bytes of a regular file are read.
func (d *localDirs) exitFileSays() string {
	const flags = os.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOFOLLOW
	var f *os.File
	var err error
	if p := os.Getenv(exitFileEnv); p != "" {
		f, err = os.OpenFile(p, flags, 0)
	} else {
		f, err = d.area.OpenFile(exitFileName, flags, 0) // stays inside the area
	}
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	b := make([]byte, 16)
	n, _ := io.ReadFull(f, b)
	return strings.TrimSpace(string(b[:n]))
}

// childSaid75 reports whether the trainer's ranks wrote 75 to the exit
// file: they were stopped for an interruption or shutdown.
func (d *localDirs) childSaid75() bool { return d.exitFileSays() == strconv.Itoa(ExitInterrupted) }

// close releases the handles; the agent touches no local file after.
func (d *localDirs) close() {
	if d.peer != nil {
		d.peer.Close()
	}
	if d.area != nil {
		d.area.Close()
	}
	if d.root != nil {
		d.root.Close()
	}
}

// restoreDir is where restores go, inside the agent's area.
func (d *localDirs) restoreDir() string { return filepath.Join(d.areaPath, restoreSub) }

// parentRoot is the open directory r.rel names r's directory in.
func (d *localDirs) parentRoot(r *request) *os.Root {
	if r.parent != nil {
		return r.parent
	}
	return d.root
}

// insideCheckpointDir accepts a directory strictly below the checkpoint
// directory, outside the areas of spotagent runs (this one's, or another's
// sharing the directory), and returns it relative to the checkpoint
// directory, "/"-separated. Symlinks are refused when it is opened.
func (d *localDirs) insideCheckpointDir(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("dir is required")
	}
	root, err := filepath.Abs(d.path)
	if err != nil {
		return "", err
	}
	p := filepath.Clean(dir)
	if !filepath.IsAbs(p) {
		p = filepath.Join(root, p)
	}
	rel, err := filepath.Rel(root, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is not inside the checkpoint directory %s", dir, root)
	}
	rel = filepath.ToSlash(rel)
	// Path elements, not a string prefix: "restore_mine" is the trainer's.
	first, _, _ := strings.Cut(rel, "/")
	if first == d.areaName {
		return "", fmt.Errorf("%s is inside the agent's own area %s", dir, d.areaPath)
	}
	if _, err := d.root.Lstat(first + "/" + areaMarker); err == nil {
		return "", fmt.Errorf("%s is inside another spotagent run's area", dir)
	}
	return rel, nil
}

// open creates (or checks) the checkpoint directory and the agent's
// area in it, and opens both.
func (dd *localDirs) open(cfg *Config) error {
	root := cfg.dir
	if root == nil {
		if err := os.MkdirAll(cfg.CheckpointDir, 0o700); err != nil {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
		var err error
		if root, err = os.OpenRoot(cfg.CheckpointDir); err != nil {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
	}
	name := areaPrefix + cfg.RunID
	d := localDirs{root: root, path: cfg.CheckpointDir, areaName: name, areaPath: filepath.Join(cfg.CheckpointDir, name)}
	// Node mode's run directory too: made 0700 by the node agent, unless
	// another user made it first.
	if err := checkCheckpointDir(root, cfg.CheckpointDir, len(cfg.Command) == 0, cfg.Log); err != nil {
		root.Close()
		return err
	}
	err := makeArea(root, name, cfg.RunID, cfg.Log)
	if err == nil {
		d.area, err = checkpoint.OpenDir(root, name)
	}
	if err == nil {
		err = MkdirIn(d.area, restoreSub)
	}
	if err != nil {
		root.Close()
		return fmt.Errorf("checkpoint dir: %s: %w", d.areaPath, err)
	}
	*dd = d
	return nil
}

// checkCheckpointDir refuses a --checkpoint-dir another user could
// rename the agent's area out of (and put a directory of theirs in its
// place, where the trainer then writes): one owned by a user other than
// the agent's euid or root, or one group or others can write without the
// sticky bit. In sidecar mode (no command) the pod is the boundary and a
// Kubernetes emptyDir is 0777 (2777 with fsGroup) without the sticky bit:
// that is logged instead.
func checkCheckpointDir(root *os.Root, path string, sidecar bool, log *zap.Logger) error {
	fi, err := root.Stat(".")
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	euid, owner, m := os.Geteuid(), ownerUID(fi), fi.Mode()
	if owner != euid && owner != 0 {
		return fmt.Errorf("checkpoint dir %s is owned by uid %d, not by uid %d that runs spotagent (mode %s): that user can swap the agent's area for a directory of theirs: %w; pick a directory of your own",
			path, owner, euid, m, checkpoint.ErrRefused)
	}
	if m.Perm()&0o022 == 0 || m&fs.ModeSticky != 0 {
		return nil
	}
	if sidecar {
		log.Warn("checkpoint dir is writable by others without the sticky bit: every container that mounts it must be trusted",
			zap.String("dir", path), zap.Int("owner_uid", owner), zap.String("mode", m.String()))
		return nil
	}
	return fmt.Errorf("checkpoint dir %s (owner uid %d, mode %s) is writable by group or others without the sticky bit: another user can swap the agent's area for a directory of theirs: %w; chmod +t it (like /tmp) or chmod go-w it, or pick a directory of your own",
		path, owner, m, checkpoint.ErrRefused)
}

// ownerUID is fi's owner (-1 when unknown).
func ownerUID(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// makeArea creates the area name below root with its marker, or checks
// that an existing one carries the marker of this run. The area must be
// the agent's euid's (else refused: another user could read and change
// the checkpoints the trainer writes there) and no one else's to enter
// (a group/other bit is taken away, and logged).
func makeArea(root *os.Root, name, runID string, log *zap.Logger) error {
	marker := name + "/" + areaMarker
	if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	area, err := checkpoint.OpenDir(root, name)
	if err != nil {
		return err
	}
	defer area.Close()
	if err := ownArea(area, log); err != nil {
		return err
	}
	if _, err := area.Lstat(areaMarker); errors.Is(err, fs.ErrNotExist) {
		if f, err := area.Open("."); err == nil {
			names, _ := f.Readdirnames(1)
			f.Close()
			if len(names) == 0 { // just made, or empty: nothing of anyone's to lose
				return checkpoint.WriteFile(root, marker, []byte(runID+"\n"), 0o600)
			}
		}
	}
	fi, err := area.Lstat(areaMarker)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("exists without the marker %s that spotagent writes: not spotagent's, refused", areaMarker)
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() > 256 {
		return fmt.Errorf("%s is not a marker file: refused", areaMarker)
	}
	b, err := area.ReadFile(areaMarker)
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(b)); got != runID {
		return fmt.Errorf("marker %s names run %q, not %q: refused", areaMarker, got, runID)
	}
	return nil
}

// ownArea checks the opened area: owned by the agent's euid, 0700.
func ownArea(area *os.Root, log *zap.Logger) error {
	f, err := area.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	euid, owner := os.Geteuid(), ownerUID(fi)
	if owner != euid {
		return fmt.Errorf("owned by uid %d, not by uid %d that runs spotagent (mode %s): another user's directory: %w; remove it or pick another --checkpoint-dir",
			owner, euid, fi.Mode(), checkpoint.ErrRefused)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := f.Chmod(0o700); err != nil {
			return fmt.Errorf("chmod 700: %w", err)
		}
		log.Warn("the agent's area was open to group or others: made 0700", zap.String("mode_was", fi.Mode().String()))
	}
	return nil
}

// fetched is a restore's files in place, before the loop records it.
type fetched struct {
	r        *restore.Result
	start    time.Time
	manifest string // the local copy of the manifest
}

// fetchRestore is the part of restore that touches only the store and the
// restore area, never the loop's state: the overlapped restore runs it
// beside the loop (agent_restore.go). nil, nil: no committed checkpoint.
func (d *localDirs) fetchRestore(ctx context.Context, st cloud.Store, opts restore.Options, log *zap.Logger) (*fetched, error) {
	restoreDir := d.restoreDir()
	start := time.Now()
	// Opened afresh for every restore, refusing a symlink: a trainer may
	// have swapped the directory since the last one.
	if err := MkdirIn(d.area, restoreSub); err != nil {
		return nil, fmt.Errorf("restore area %s: %w", restoreDir, err)
	}
	dest, err := checkpoint.OpenDir(d.area, restoreSub)
	if err != nil {
		return nil, fmt.Errorf("restore area %s: %w", restoreDir, err)
	}
	defer dest.Close()
	if d.tier != nil { // asked only for the checkpoint the store's rules chose
		opts.Tiers = append(opts.Tiers, d.tier)
	}
	if d.peer != nil { // after this machine's copy, before the store
		opts.Tiers = append(opts.Tiers, d.peer.Tier())
	}
	r, err := restore.Into(ctx, st, dest, restoreDir, opts)
	if errors.Is(err, restore.ErrNoCheckpoint) {
		log.Info("no committed checkpoint: starting fresh", zap.String("store", st.URI("")))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// A local copy of the manifest, beside (not inside) the checkpoint's
	// directory: SPOTAGENT_RESUME_MANIFEST points at it.
	name := filepath.Base(r.Dir)
	manifestName := name + ".manifest.json"
	manifest := filepath.Join(restoreDir, manifestName)
	if b, err := json.MarshalIndent(r.Manifest, "", "  "); err == nil {
		if err := checkpoint.WriteFile(dest, manifestName, b, 0o600); err != nil {
			log.Warn("could not write the local manifest copy", zap.Error(err))
		}
	}
	// Older restores are of no further use.
	if f, err := dest.Open("."); err == nil {
		names, _ := f.Readdirnames(-1)
		f.Close()
		for _, n := range names {
			if n != name && n != manifestName {
				dest.RemoveAll(n)
			}
		}
	}
	log.Info("restored checkpoint", zap.Int64("step", r.Manifest.Step), zap.String("id", r.Manifest.ID),
		zap.String("dir", r.Dir), zap.Int64("bytes", r.Bytes), zap.Duration("took", r.Took), zap.Int("skipped", len(r.Skipped)),
		zap.String("from", journal.Sources(r.From)), zap.Int64("local_bytes", r.From[checkpoint.FromLocal]), zap.Int64("peer_bytes", r.From[checkpoint.FromPeer]),
		zap.Int64("store_bytes", r.From[checkpoint.FromStore]))
	return &fetched{r: r, start: start, manifest: manifest}, nil
}

// removeDir deletes r's directory through the agent's handles: never
// anything outside the checkpoint directory, and, once the directory was
// opened for the commit, only what that directory holds.
func (d *localDirs) removeDir(r *request, goBg func(func()), log *zap.Logger) {
	if r.pipe != nil {
		r.pipe.Abort() // after a commit, a no-op; else its early uploads go
		goBg(r.pipe.Wait)
	}
	if err := checkpoint.RemoveDir(d.parentRoot(r), r.rel, r.held); err != nil {
		log.Warn("could not remove a checkpoint directory", zap.String("dir", r.dir), zap.Error(err))
	}
	if r.held != nil {
		r.held.Close()
		r.held = nil
	}
}

// cleanup removes what a crashed agent left behind: the store's temp files
// or incomplete multipart uploads, partial restores, and the checkpoint
// directories it handed out that no trainer will answer for any more. It
// deletes only in the agent's own area, and only names it makes. A sidecar
// leaves request directories alone: its trainer may still be running and
// own them.
func (d *localDirs) cleanup(ctx context.Context, st cloud.Store, opts []cloud.CleanupOptions, requests bool, log *zap.Logger) {
	if c, ok := st.(cloud.Cleaner); ok {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := c.Cleanup(cctx, opts...) // job_policy.go
		cancel()
		switch {
		case err != nil:
			log.Warn("store cleanup failed", zap.Error(err))
		case n > 0:
			log.Info("store cleanup: removed what an earlier crash left", zap.Int("objects", n))
		}
	}
	if dest, err := checkpoint.OpenDir(d.area, restoreSub); err == nil {
		for _, n := range readNames(dest) {
			if strings.HasPrefix(n, ".partial-") {
				dest.RemoveAll(n)
			}
		}
		dest.Close()
	}
	if !requests {
		return
	}
	n := 0
	for _, name := range readNames(d.area) {
		if isRequestID(name) && d.area.RemoveAll(name) == nil {
			n++
		}
	}
	if n > 0 {
		log.Info("removed checkpoint directories an earlier run left", zap.Int("dirs", n), zap.String("area", d.areaPath))
	}
}

// openTier opens the local tier, <area>/committed (docs/storage.md, "The
// local tier"): nil when cfg turns it off (what an earlier start kept is
// deleted then), in watch mode (the watched directory is its own local
// copy) or when it cannot be opened (logged: restores come from the
// store).
func (d *localDirs) openTier(cfg *Config, log *zap.Logger) *localtier.Tier {
	if cfg.Watch != nil {
		return nil
	}
	if cfg.LocalKeep < 1 {
		if err := d.area.RemoveAll(tierSub); err != nil {
			log.Warn("could not delete the local tier's copies", zap.Error(err))
		}
		return nil
	}
	t, err := localtier.Open(d.root, d.areaName+"/"+tierSub, localtier.Options{Keep: cfg.LocalKeep, MaxBytes: cfg.LocalMaxBytes, Log: log})
	if err != nil {
		log.Warn("local tier off: restores come from the store", zap.Error(err))
		return nil
	}
	return t
}

// keep makes the committed checkpoint of r (res) the local tier's copy,
// when there is a tier and r's directory is below the checkpoint
// directory (not watch mode's stage); only by hard links when copyOK is
// false (a stop's checkpoint: the trainer waits for committed). Run in
// the commit's goroutine, before the loop deletes r's directory.
func (d *localDirs) keep(ctx context.Context, r *request, res *commit.Result, part *checkpoint.PartSpec, copyOK bool, log *zap.Logger) {
	if d.tier == nil || r.parent != nil {
		return
	}
	node := ""
	if part != nil {
		node = part.Node
	}
	if err := d.tier.Keep(ctx, r.rel, res.Manifest, node, copyOK); err != nil {
		log.Warn("no local copy of the committed checkpoint: a restart here restores it from the store", zap.String("id", r.id), zap.Error(err))
		return
	}
	d.publishPeer(ctx, res.Manifest, copyOK, log) // agent_peertier.go
}
