package nodemode

import (
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// A finished run's area (<root>/<run id>[/node-K]/spotagent-<run id>/:
// restore/ and the local tier's committed/) stays on the node, so that a
// pod of the run recreated here restores from disk. The node agent
// removes the areas of runs it does not host: at its start, when a run
// ends and every areaPruneEvery, those whose last use is DefaultAreaTTL
// old or more; then, oldest first, more of them (unused for areaDiskGrace
// at least) while the checkpoint root's filesystem has less than
// areaMinFree of it free. A run that comes back after its area went
// restores from the store.
const (
	DefaultAreaTTL = 24 * time.Hour
	// areaMinFree: the kubelet evicts pods once nodefs.available < 10%
	// (its default hard threshold); finished runs' areas go before that.
	areaMinFree = 0.15
	// areaDiskGrace: a whole-job restart recreates its pods within
	// minutes; the disk rule leaves them their areas.
	areaDiskGrace  = 15 * time.Minute
	areaPruneEvery = time.Hour
	// prunedPrefix names an area taken out of its run directory, being
	// deleted: never a run id (validRunID refuses a leading '.').
	prunedPrefix = ".pruned-"
)

// areaPruner removes finished runs' areas below root, never following a
// symlink: every step goes through the root's handle.
type areaPruner struct {
	root  *os.Root
	ttl   time.Duration // < 0: never by age
	now   func() time.Time
	free  func() (avail, total uint64, err error) // nil: no disk rule
	spawn func(func())                            // runs the deletes (a goroutine of the node)
	log   *zap.Logger
}

// runArea is one run's area found on disk.
type runArea struct {
	key  string // the run's key (runKey): "<id>" or "<id>/node-K"
	name string // the area, relative to the root
	last time.Time
}

// touch marks the area of the run key as used now (its run just ended).
func (p *areaPruner) touch(key string) {
	id, _, _ := strings.Cut(key, "/")
	name := key + "/" + localdirs.AreaPrefix + id
	if fi, err := p.root.Lstat(name); err != nil || !fi.IsDir() {
		return
	}
	now := p.now()
	if err := p.root.Chtimes(name, now, now); err != nil {
		p.log.Warn("node: could not mark a run's area as used", zap.String("run", key), zap.Error(err))
	}
}

// prune removes the areas of runs not in hosted that are too old, then
// oldest first while the disk is short of free space.
func (p *areaPruner) prune(hosted map[string]bool) {
	hostedID := map[string]bool{}
	for k := range hosted {
		id, _, _ := strings.Cut(k, "/")
		hostedID[id] = true
	}
	var idle []runArea
	for _, a := range p.list() {
		if !hosted[a.key] {
			idle = append(idle, a)
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].last.Before(idle[j].last) })
	now := p.now()
	var kept []runArea
	for _, a := range idle {
		if p.ttl >= 0 && now.Sub(a.last) >= p.ttl {
			p.remove(a, now, "unused for the TTL", hostedID)
			continue
		}
		kept = append(kept, a)
	}
	if p.free == nil || len(kept) == 0 {
		return
	}
	avail, total, err := p.free()
	if err != nil {
		p.log.Warn("node: free space of the checkpoint root unknown: areas pruned by age only", zap.Error(err))
		return
	}
	want := uint64(float64(total) * areaMinFree)
	for _, a := range kept {
		if avail >= want || now.Sub(a.last) < areaDiskGrace {
			return
		}
		if b, ok := p.remove(a, now, "disk short of free space", hostedID); ok {
			avail += uint64(b)
		}
	}
}

// remove takes area a out of its run directory (a rename: the dispatcher
// does not wait on the delete), logs it, and deletes it with spawn. The
// run directory goes too when empty.
func (p *areaPruner) remove(a runArea, now time.Time, why string, hostedID map[string]bool) (bytes int64, ok bool) {
	bytes = diskBytes(p.root, a.name)
	trash := prunedPrefix + localdirs.NewRequestID()
	if err := p.root.Rename(a.name, trash); err != nil {
		p.log.Warn("node: could not remove a finished run's area", zap.String("run", a.key), zap.Error(err))
		return 0, false
	}
	p.log.Info("node: removed a finished run's area", zap.String("run", a.key), zap.Int64("bytes", bytes),
		zap.Int64("age_s", int64(now.Sub(a.last)/time.Second)), zap.String("why", why))
	// Each fails unless empty. <id> stays while a run of that id is
	// hosted: its part's directory may be being made in it.
	id, _, isPart := strings.Cut(a.key, "/")
	if isPart {
		p.root.Remove(a.key)
	}
	if !hostedID[id] {
		p.root.Remove(id)
	}
	p.spawn(func() { p.delete(trash) })
	return bytes, true
}

// delete removes an area taken out by remove (or left by a crash).
func (p *areaPruner) delete(trash string) {
	if err := p.root.RemoveAll(trash); err != nil {
		p.log.Warn("node: could not delete a removed area", zap.String("dir", trash), zap.Error(err))
	}
}

// leftovers deletes the areas an earlier node agent took out but did not
// finish deleting.
func (p *areaPruner) leftovers() {
	for _, name := range dirNames(p.root, ".") {
		if strings.HasPrefix(name, prunedPrefix) {
			p.spawn(func() { p.delete(name) })
		}
	}
}

// list is every run's area below the root: <id>/spotagent-<id> and
// <id>/node-K/spotagent-<id>, each a directory (not a symlink) holding
// the marker of its run.
func (p *areaPruner) list() []runArea {
	var out []runArea
	for _, id := range dirNames(p.root, ".") {
		if !validRunID(id) {
			continue
		}
		if a, ok := p.area(id, id); ok {
			out = append(out, a)
		}
		for _, part := range dirNames(p.root, id) {
			if k, err := strconv.Atoi(strings.TrimPrefix(part, "node-")); err == nil && supervisor.NodePart(k) == part {
				if a, ok := p.area(id, id+"/"+part); ok {
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// area is the area of run id in run directory dir, if there is one.
func (p *areaPruner) area(id, dir string) (runArea, bool) {
	a := runArea{key: dir, name: dir + "/" + localdirs.AreaPrefix + id}
	fi, err := p.root.Lstat(a.name)
	if err != nil || !fi.IsDir() {
		return a, false
	}
	marker := a.name + "/" + localdirs.AreaMarker
	if mi, err := p.root.Lstat(marker); err != nil || !mi.Mode().IsRegular() {
		return a, false
	}
	if b, err := p.root.ReadFile(marker); err != nil || strings.TrimSpace(string(b)) != id {
		return a, false
	}
	a.last = fi.ModTime()
	for _, sub := range []string{localdirs.RestoreSub, localdirs.TierSub} {
		if si, err := p.root.Lstat(a.name + "/" + sub); err == nil && si.IsDir() && si.ModTime().After(a.last) {
			a.last = si.ModTime()
		}
	}
	return a, true
}

// diskBytes is the disk space the files below name take, each inode
// counted once (the local tier hard-links a request's files). Symlinks
// are not followed.
func diskBytes(root *os.Root, name string) int64 {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var n int64
	fs.WalkDir(root.FS(), name, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			n += fi.Size()
			return nil
		}
		if k := (inode{uint64(st.Dev), st.Ino}); !seen[k] {
			seen[k] = true
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// dirNames lists the directories (not symlinks) directly in dir below root.
func dirNames(root *os.Root, dir string) []string {
	d, err := checkpoint.OpenDir(root, dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	f, err := d.Open(".")
	if err != nil {
		return nil
	}
	defer f.Close()
	ents, _ := f.ReadDir(-1) // what it read before an error
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// rootFree is the free and total bytes of root's filesystem.
func rootFree(root *os.Root) func() (uint64, uint64, error) {
	return func() (uint64, uint64, error) {
		f, err := root.Open(".")
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		var st syscall.Statfs_t
		if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
			return 0, 0, err
		}
		return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
	}
}
