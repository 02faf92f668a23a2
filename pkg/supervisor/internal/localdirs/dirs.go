// Package localdirs is the agent's local directories: the checkpoint
// directory and the agent's area in it, opened once and then used only
// through their handles; their ownership checks, the restore area and the
// start-up cleanup; the local tier, and the peer tier that
// serves restores from the job's other nodes.
package localdirs

// The agent's local directories (Dirs): the checkpoint directory and the
// area, opened once and used through their handles; ownership checks, the
// restore area, the start-up cleanup, the exit file; the local tier and
// the peer tier of a job's node (started beside the local tier, asked
// after it); and, last, what is handed to a trainer of another uid (a
// request's directory, the way to it, a restored checkpoint to read).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/pathtrust"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/localtier"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Dirs are the agent's handles on its local directories: every
// operation below the checkpoint directory goes through them, never by
// path, so that a trainer swapping a directory for a symlink cannot
// redirect a write or a delete.
type Dirs struct {
	Root     *os.Root // --checkpoint-dir
	Area     *os.Root // Root/AreaName
	Path     string   // --checkpoint-dir, as given
	AreaName string
	AreaPath string
	tier     *localtier.Tier // this machine's copies (OpenTier); nil: off
	peer     *peertier.Node  // the other nodes' copies (the peer tier, below); nil: off
}

// ExitFileSays is what the ranks wrote to the exit file, trimmed ("" when
// nothing). The trainer can replace the file: it is opened without
// blocking (a FIFO), a user-named path without following a symlink, and
// only a few bytes of a regular file are read.
func (d *Dirs) ExitFileSays() string {
	const flags = os.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOFOLLOW
	var f *os.File
	var err error
	if p := os.Getenv(ExitFileEnv); p != "" {
		f, err = os.OpenFile(p, flags, 0)
	} else {
		f, err = d.Area.OpenFile(ExitFileName, flags, 0) // stays inside the area
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

// Close releases the handles; the agent touches no local file after.
func (d *Dirs) Close() {
	if d.peer != nil {
		d.peer.Close()
	}
	if d.Area != nil {
		d.Area.Close()
	}
	if d.Root != nil {
		d.Root.Close()
	}
}

// RestoreDir is where restores go, inside the agent's area.
func (d *Dirs) RestoreDir() string { return filepath.Join(d.AreaPath, RestoreSub) }

// InsideCheckpointDir accepts a directory strictly below the checkpoint
// directory, outside the areas of spotagent runs (this one's, or another's
// sharing the directory), and returns it relative to the checkpoint
// directory, "/"-separated. Symlinks are refused when it is opened.
func (d *Dirs) InsideCheckpointDir(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("dir is required")
	}
	root, err := filepath.Abs(d.Path)
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
	if first == d.AreaName {
		return "", fmt.Errorf("%s is inside the agent's own area %s", dir, d.AreaPath)
	}
	if _, err := d.Root.Lstat(first + "/" + AreaMarker); err == nil {
		return "", fmt.Errorf("%s is inside another spotagent run's area", dir)
	}
	return rel, nil
}

// Open creates (or checks) the checkpoint directory path and the
// agent's area in it for run runID, and opens both. root, when not nil,
// is path already opened (node mode makes it through its root's handle):
// the Dirs own and close it. A sidecar (no command) has a laxer check of
// path's mode (checkCheckpointDir).
func Open(root *os.Root, path, runID string, sidecar bool, log *zap.Logger) (Dirs, error) {
	if root == nil {
		// The levels that exist are judged before the missing ones are
		// made: under a directory of another user's, a level that user
		// points elsewhere would have the agent make the rest there.
		if err := checkBeforeMaking(path); err != nil {
			return Dirs{}, err
		}
		if err := os.MkdirAll(path, 0o700); err != nil {
			return Dirs{}, fmt.Errorf("checkpoint dir: %w", err)
		}
		var err error
		if root, err = os.OpenRoot(path); err != nil {
			return Dirs{}, fmt.Errorf("checkpoint dir: %w", err)
		}
	}
	name := AreaPrefix + runID
	d := Dirs{Root: root, Path: path, AreaName: name, AreaPath: filepath.Join(path, name)}
	// Node mode's run directory too: made 0700 (0711 with --allow-uid) by the node agent, unless
	// another user made it first.
	err := checkAncestors(root, path, sidecar, log)
	if err == nil {
		err = checkCheckpointDir(root, path, sidecar, log)
	}
	if err != nil {
		root.Close()
		return Dirs{}, err
	}
	err = makeArea(root, name, runID, log)
	if err == nil {
		d.Area, err = checkpoint.OpenDir(root, name)
	}
	if err == nil {
		err = MkdirIn(d.Area, RestoreSub)
	}
	if err != nil {
		root.Close()
		return Dirs{}, fmt.Errorf("checkpoint dir: %s: %w", d.AreaPath, err)
	}
	return d, nil
}

// checkAncestors refuses a --checkpoint-dir below a directory another
// user could rename it out of (and put a directory of theirs in its
// place, where the trainer, told the path, then writes and restores
// from): every directory the path is looked up through must be owned by
// root or the agent's euid, and not writable by group or others without
// the sticky bit (pathtrust.Walk). A symlink on the way is followed as
// the kernel follows it: the directories on the way to its target are
// judged, and so is its owner; the path itself is kept as given. In
// sidecar mode (no command) the pod is the boundary, as for the
// directory itself: a directory on the way that is writable without the
// sticky bit (an emptyDir holding --checkpoint-dir) is logged instead;
// one of another user's is refused there too. The directory the walk
// ends at must be root, the one opened (before the walk: made, then
// opened, then judged, so that no level made meanwhile escapes it).
func checkAncestors(root *os.Root, path string, sidecar bool, log *zap.Logger) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	real, bad, err := pathtrust.Walk(abs, pathtrust.Trusted)
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	for _, u := range bad {
		if sidecar && u.Writable {
			log.Warn("a directory above the checkpoint dir is writable by others without the sticky bit: every container that mounts it must be trusted",
				zap.String("dir", path), zap.String("above", u.Path), zap.Int("owner_uid", u.Owner), zap.String("mode", u.Mode.String()))
			continue
		}
		return refusedAbove(path, u)
	}
	opened, err := root.Stat(".")
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	if fi, err := os.Stat(real); err != nil || !os.SameFile(fi, opened) {
		return fmt.Errorf("checkpoint dir %s: %s is not the directory opened: %w", path, real, checkpoint.ErrRefused)
	}
	return nil
}

// checkBeforeMaking judges, before MkdirAll, the part of path that exists:
// the directories up to the one its first missing level would be made in
// (that one included). Only another user's directory is refused here; a
// writable one is judged once the path is made (checkAncestors: a
// sidecar only warns of it).
func checkBeforeMaking(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	bad, err := pathtrust.WalkExisting(abs, pathtrust.Trusted)
	if err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	for _, u := range bad {
		if !u.Writable {
			return refusedAbove(path, u)
		}
	}
	return nil
}

// refusedAbove is the refusal of a checkpoint dir path below u.
func refusedAbove(path string, u pathtrust.Unsafe) error {
	return fmt.Errorf("checkpoint dir %s: %v, on the way to it: another user can rename the checkpoint dir away and put theirs in its place: %w; %s",
		path, u, checkpoint.ErrRefused, u.Fix())
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

// makeArea creates the area name below root with its marker, or checks
// that an existing one carries the marker of this run. The area must be
// the agent's euid's (else refused: another user could read and change
// the checkpoints the trainer writes there) and no one else's to enter
// (a group/other bit is taken away, and logged).
func makeArea(root *os.Root, name, runID string, log *zap.Logger) error {
	marker := name + "/" + AreaMarker
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
	if _, err := area.Lstat(AreaMarker); errors.Is(err, fs.ErrNotExist) {
		if f, err := area.Open("."); err == nil {
			names, _ := f.Readdirnames(1)
			f.Close()
			if len(names) == 0 { // just made, or empty: nothing of anyone's to lose
				return checkpoint.WriteFile(root, marker, []byte(runID+"\n"), 0o600)
			}
		}
	}
	fi, err := area.Lstat(AreaMarker)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("exists without the marker %s that spotagent writes: not spotagent's, refused", AreaMarker)
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() > 256 {
		return fmt.Errorf("%s is not a marker file: refused", AreaMarker)
	}
	b, err := area.ReadFile(AreaMarker)
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(b)); got != runID {
		return fmt.Errorf("marker %s names run %q, not %q: refused", AreaMarker, got, runID)
	}
	return nil
}

// ownArea checks the opened area: owned by the agent's euid, 0700 (0711
// once a trainer of another uid was handed a directory in it).
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
	// Search (x) alone is let through (LetThrough): it lists nothing and
	// writes nothing; a trainer of another uid reaches its directory by name.
	if fi.Mode().Perm()&0o066 != 0 {
		if err := f.Chmod(fi.Mode().Perm() &^ 0o066); err != nil {
			return fmt.Errorf("chmod 700: %w", err)
		}
		log.Warn("the agent's area was open to group or others: read and write taken away", zap.String("mode_was", fi.Mode().String()))
	}
	return nil
}

// Fetched is a restore's files in place, before the loop records it.
type Fetched struct {
	R        *restore.Result
	Start    time.Time
	Dir      string // where the trainer finds it (R.Dir, or zero-code mode's name in its directory)
	Manifest string // the local copy of the manifest
}

// FetchRestore is the part of restore that touches only the store and the
// restore area, never the loop's state: the agent's restores run it
// beside the loop (pkg/supervisor/internal/bootrestore). nil, nil: no
// committed checkpoint.
func (d *Dirs) FetchRestore(ctx context.Context, st cloud.Store, opts restore.Options, log *zap.Logger) (*Fetched, error) {
	restoreDir := d.RestoreDir()
	start := time.Now()
	// Opened afresh for every restore, refusing a symlink: a trainer may
	// have swapped the directory since the last one.
	if err := MkdirIn(d.Area, RestoreSub); err != nil {
		return nil, fmt.Errorf("restore area %s: %w", restoreDir, err)
	}
	dest, err := checkpoint.OpenDir(d.Area, RestoreSub)
	if err != nil {
		return nil, fmt.Errorf("restore area %s: %w", restoreDir, err)
	}
	defer dest.Close()
	dropHanded(dest)   // a trainer's, never reused
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
	return &Fetched{R: r, Start: start, Dir: r.Dir, Manifest: manifest}, nil
}

// Cleanup removes what a crashed agent left behind: the store's temp files
// or incomplete multipart uploads, partial restores, and the checkpoint
// directories it handed out that no trainer will answer for any more. It
// deletes only in the agent's own area, and only names it makes. A sidecar
// leaves request directories alone: its trainer may still be running and
// own them.
func (d *Dirs) Cleanup(ctx context.Context, st cloud.Store, opts []cloud.CleanupOptions, requests bool, log *zap.Logger) {
	if c, ok := st.(cloud.Cleaner); ok {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := c.Cleanup(cctx, opts...) // the job policy's (pkg/supervisor)
		cancel()
		switch {
		case err != nil:
			log.Warn("store cleanup failed", zap.Error(err))
		case n > 0:
			log.Info("store cleanup: removed what an earlier crash left", zap.Int("objects", n))
		}
	}
	if dest, err := checkpoint.OpenDir(d.Area, RestoreSub); err == nil {
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
	for _, name := range readNames(d.Area) {
		if IsRequestID(name) && d.Area.RemoveAll(name) == nil {
			n++
		}
	}
	if n > 0 {
		log.Info("removed checkpoint directories an earlier run left", zap.Int("dirs", n), zap.String("area", d.AreaPath))
	}
}

// OpenTier opens the local tier, <area>/committed (docs/storage.md, "The
// local tier"), keeping keep checkpoints of at most maxBytes (0: no
// bound): nil when keep < 1 turns it off (what an earlier start kept is
// deleted then) or when it cannot be opened (logged: restores come from
// the store). Watch mode opens none (the watched directory is its own
// local copy).
func (d *Dirs) OpenTier(keep int, maxBytes int64, log *zap.Logger) {
	if keep < 1 {
		if err := d.Area.RemoveAll(TierSub); err != nil {
			log.Warn("could not delete the local tier's copies", zap.Error(err))
		}
		return
	}
	t, err := localtier.Open(d.Root, d.AreaName+"/"+TierSub, localtier.Options{Keep: keep, MaxBytes: maxBytes, Log: log})
	if err != nil {
		log.Warn("local tier off: restores come from the store", zap.Error(err))
		return
	}
	d.tier = t
}

// Tier is this machine's copies (OpenTier; nil: off).
func (d *Dirs) Tier() *localtier.Tier { return d.tier }

// ExitFileEnv names the file the Python client writes 75 to when it was
// stopped for an interruption or shutdown; ExitFileName is where the agent
// points it, in its own area, unless the user set one.
const (
	ExitFileEnv  = "SPOTAGENT_EXIT_FILE"
	ExitFileName = "exit-code"
)

// The agent's area inside --checkpoint-dir holds everything it creates
// there. It is per run, so that runs sharing a checkpoint directory never
// touch each other's files, and carries a marker naming the run: the agent
// deletes nothing in a directory it did not make, and nothing outside its
// area.
const (
	AreaPrefix = "spotagent-"
	AreaMarker = ".spotagent-run"
	RestoreSub = "restore"
	TierSub    = "committed" // the local tier (OpenTier)
)

// NewRequestID returns a fresh checkpoint id: unique across agents and
// restarts.
func NewRequestID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IsRequestID tells the names NewRequestID makes: 12 lowercase hex digits.
func IsRequestID(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MkdirIn creates the directory name below r unless it exists; an
// existing entry that is not a directory (a symlink, say) is refused.
func MkdirIn(r *os.Root, name string) error {
	err := r.Mkdir(name, 0o700)
	if err == nil || !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := r.Lstat(name)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symlink: %w", name, checkpoint.ErrRefused)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%s): %w", name, fi.Mode().Type(), checkpoint.ErrRefused)
	}
	return nil
}

// ownerUID is fi's owner (-1 when unknown).
func ownerUID(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// readNames lists the names in r (none if it cannot be read).
func readNames(r *os.Root) []string {
	f, err := r.Open(".")
	if err != nil {
		return nil
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return names
}

// PeerTierConfig turns on the peer tier of a multi-node job's node
// (pkg/checkpoint/peertier, docs/distributed.md "Restore from a peer"):
// the agent serves its local tier's copies to the job's other agents and
// restores files from theirs before the store.
type PeerTierConfig struct {
	Enabled   bool
	Listen    string   // TCP address (":0": the kernel's choice)
	Advertise []string // hosts the other nodes reach this one at; empty: every address
	Stall     time.Duration
	// PeerWait bounds how long a restore waits, in all, for peers still
	// starting (peertier.Config.PeerWait): 0, the default; negative, none.
	PeerWait time.Duration
	// Replicas 1: keep a copy of another node's part too, a far one (--replicas).
	Replicas int
	// Shared: serve on this listener, not one of the run's own (node mode).
	Shared *peertier.Listener
	// Machine is this node's machine (the agent fills it from its
	// metadata): published in its record.
	Machine checkpoint.Machine
	// Network: peertier.Config.Network (nil: the machine's TCP).
	Network peertier.Network
}

// tierConfig is the peer tier's configuration for node of run runID in
// st, this session's.
func (c PeerTierConfig) tierConfig(st cloud.Store, runID, node, session string, log *zap.Logger) peertier.Config {
	return peertier.Config{Store: st, RunID: runID, Node: node, Session: session,
		Listen: c.Listen, Advertise: c.Advertise, Stall: c.Stall, PeerWait: c.PeerWait, Replicas: c.Replicas, Machine: c.Machine, Shared: c.Shared, Network: c.Network, Log: log}
}

// peerStartTimeout bounds the store requests of the peer tier's start (the
// secret, the record): a slow store delays the start no longer than this.
const peerStartTimeout = 30 * time.Second

// OpenPeer starts the peer tier of node (of run runID in st, this
// session's) when c asks for it: nil when off, when this agent is no node
// of a job (node "") or when it cannot start (logged: restores then come
// from the local tier and the store). Watch mode opens none.
func (d *Dirs) OpenPeer(ctx context.Context, c PeerTierConfig, st cloud.Store, runID, node, session string, log *zap.Logger) {
	if !c.Enabled || node == "" {
		return
	}
	pc := c.tierConfig(st, runID, node, session, log)
	if d.tier != nil {
		pc.Local = d.tier
	} else {
		log.Warn("peer tier: no local tier (--local-keep 0): this node serves its peers nothing, and only asks them")
	}
	ctx, cancel := context.WithTimeout(ctx, peerStartTimeout)
	defer cancel()
	n, err := peertier.Start(ctx, pc)
	if err != nil {
		log.Warn("peer tier off: restores come from this machine and the store", zap.Error(err))
		return
	}
	d.peer = n
}

// PublishPeer tells the other nodes what the local tier holds now (after
// it kept a copy of m); a failure costs them the store, nothing more.
// With --replicas, the part of m this node keeps is then copied in the
// background, except for a stop's checkpoint (replicate false): the agent
// is about to exit, and does not wait for it.
func (d *Dirs) PublishPeer(ctx context.Context, m *checkpoint.Manifest, replicate bool, log *zap.Logger) {
	if d.peer == nil {
		return
	}
	if err := d.peer.Publish(ctx); err != nil {
		log.Warn("peer tier: record not updated: the other nodes restore this copy from the store", zap.Error(err))
	}
	if replicate {
		d.peer.Replicate(m)
	}
}

// A restored checkpoint handed to a trainer of another uid than a root
// agent's (node or sidecar mode with --allow-uid; HandRestore) is:
//
//	restore/                  root's, 0711 (search only: nothing listed)
//	restore/<name>/           the trainer uid's, 0500: only it (and root) enters
//	restore/<name>/<subdir>/  root's, 0555
//	restore/<name>/<file>     root's, 0444: read, never written nor chmodded
//	restore/<name>.manifest.json  the trainer uid's, 0400
//
// The files are the restore's own copies (restore writes each one, from
// the local tier or the store; nothing is linked to the local tier's
// copies), and they stay root's: the trainer reads them through the one
// directory it owns, and can change no byte of them. It can add or
// rename entries in that directory (it owns it): the agent never reads a
// handed directory again (FetchRestore deletes it rather than reuse it).
const (
	handedDirMode  = 0o500
	handedSubMode  = 0o555
	handedFileMode = 0o444
	handedManMode  = 0o400
)

// HandRestore lets uid, and no one else but root, read the restored
// checkpoint dir and its manifest copy manifest (both as FetchRestore
// returned them, directly in the restore area; manifest may be ""), and
// lets it through the agent's directories above (LetThrough). Everything
// is opened through the area's handle refusing symlinks and changed
// through the opened handles. Handing again to the same uid does nothing;
// a directory already handed to another uid is refused (its trainer may
// have changed what is in it).
func (d *Dirs) HandRestore(dir, manifest string, uid int) error {
	if uid < 0 || uid == os.Geteuid() {
		return nil
	}
	name, err := d.inRestoreArea(dir)
	if err != nil {
		return err
	}
	rest, err := checkpoint.OpenDir(d.Area, RestoreSub)
	if err != nil {
		return fmt.Errorf("restore area: %w", err)
	}
	defer rest.Close()
	if err := handTree(rest, name, uid); err != nil {
		return fmt.Errorf("restored checkpoint %s: %w", dir, err)
	}
	if manifest != "" {
		mname, err := d.inRestoreArea(manifest)
		if err != nil {
			return err
		}
		if err := handManifest(rest, mname, uid); err != nil {
			return fmt.Errorf("manifest copy %s: %w", manifest, err)
		}
	}
	for _, r := range []*os.Root{rest, d.Area, d.Root} {
		if err := LetThrough(r); err != nil {
			return err
		}
	}
	return nil
}

// inRestoreArea returns the name of p, which must be an entry directly in
// the restore area.
func (d *Dirs) inRestoreArea(p string) (string, error) {
	name := filepath.Base(p)
	if filepath.Clean(p) != filepath.Join(d.RestoreDir(), name) || name == "." || name == ".." {
		return "", fmt.Errorf("%s is not in the restore area %s: %w", p, d.RestoreDir(), checkpoint.ErrRefused)
	}
	return name, nil
}

// handManifest gives the manifest copy name below rest to uid, 0400.
func handManifest(rest *os.Root, name string, uid int) error {
	f, err := rest.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // not written (logged by FetchRestore): nothing to hand
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), checkpoint.ErrRefused)
	}
	if err := owned(fi, uid); err != nil {
		return err
	}
	if err := f.Chmod(handedManMode); err != nil {
		return err
	}
	return f.Chown(uid, -1)
}

// owned refuses fi when another uid than the agent's euid or uid owns it.
func owned(fi fs.FileInfo, uid int) error {
	if o := ownerUID(fi); o != os.Geteuid() && o != uid {
		return fmt.Errorf("already handed to uid %d, not to uid %d: %w", o, uid, checkpoint.ErrRefused)
	}
	return nil
}

// handTree makes the tree name below rest root's and read-only (0555
// directories, 0444 files), then its top directory uid's, 0500, last:
// until then it is root's and 0700, so nobody else can change it while it
// is walked. Only directories and regular files are accepted (a restore
// makes nothing else). Already uid's: nothing to do.
func handTree(rest *os.Root, name string, uid int) error {
	top, err := checkpoint.OpenDir(rest, name)
	if err != nil {
		return err
	}
	defer top.Close()
	tf, err := top.Open(".")
	if err != nil {
		return err
	}
	defer tf.Close()
	fi, err := tf.Stat()
	if err != nil {
		return err
	}
	if err := owned(fi, uid); err != nil {
		return err
	}
	if ownerUID(fi) == uid {
		return nil
	}
	if err := readOnlyBelow(top, "."); err != nil {
		return err
	}
	if err := tf.Chmod(handedDirMode); err != nil {
		return err
	}
	return tf.Chown(uid, -1)
}

// readOnlyBelow makes every entry of the directory rel below top (its
// subdirectories recursively) read-only for everyone, through handles
// opened without following a symlink.
func readOnlyBelow(top *os.Root, rel string) error {
	d, err := top.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(rel, n)
		f, err := top.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err) // a symlink: ELOOP
		}
		fi, err := f.Stat()
		switch {
		case err != nil:
		case fi.IsDir():
			err = f.Chmod(handedSubMode)
		case fi.Mode().IsRegular():
			err = f.Chmod(handedFileMode)
		default:
			err = fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), checkpoint.ErrRefused)
		}
		f.Close()
		if err == nil && fi.IsDir() {
			err = readOnlyBelow(top, p)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// dropHanded deletes the entries of the restore area rest that the agent
// no longer owns (handed to a trainer's uid by an earlier start): their
// trainer may have changed them, so they are never reused.
func dropHanded(rest *os.Root) {
	euid := os.Geteuid()
	for _, n := range readNames(rest) {
		if fi, err := rest.Lstat(n); err == nil && ownerUID(fi) != euid {
			rest.RemoveAll(n)
		}
	}
}

// LetThrough adds the search bit (x) for group and others to the
// directory r is open on, when the agent's euid owns it: a trainer of
// another uid can then reach a directory below it by name (HandTo), but
// neither list nor write this one. Through the handle: never a symlink.
func LetThrough(r *os.Root) error {
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	perm := fi.Mode().Perm()
	if ownerUID(fi) != os.Geteuid() || perm&0o011 == 0o011 {
		return nil
	}
	if err := f.Chmod(perm | 0o011); err != nil {
		return fmt.Errorf("chmod %o: %w", perm|0o011, err)
	}
	return nil
}

// HandTo gives the directory name below r, which the agent just made
// (0700), to uid: the trainer of that uid writes its checkpoint there and
// nobody else can (the agent, root, still reads it to upload). Opened
// through r refusing a symlink, and changed through that handle.
func HandTo(r *os.Root, name string, uid int) error {
	d, err := checkpoint.OpenDir(r, name)
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := d.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(uid, -1); err != nil {
		return fmt.Errorf("chown %d: %w", uid, err)
	}
	return f.Chmod(0o700)
}
