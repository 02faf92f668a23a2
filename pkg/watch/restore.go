package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Restored is a checkpoint put back into DIR under its original name.
type Restored struct {
	*checkpoint.Restored
	Name string
	Kind string
	Path string // DIR/Name
}

// ErrNotWatched reports a committed checkpoint without the original name a
// watch-mode commit records: one the protocol mode committed.
var ErrNotWatched = errors.New("checkpoint was not committed in watch mode")

// Restore puts the newest committed checkpoint back into w's DIR under
// the name it had there, so that the framework's own resume finds it. It
// downloads and verifies into a hidden directory inside DIR, then renames:
// the trainer never sees a partial checkpoint. What stands in its way is
// moved aside (".spotagent-aside-..."), never deleted: a local copy of the
// same name that does not verify, and, for a layout with a completion
// marker, newer local checkpoints without it (torn writes the framework's
// resume would otherwise pick). It returns checkpoint.ErrNoCheckpoint when
// the store holds none.
func (w *Watcher) Restore(ctx context.Context, st cloud.Store, opts checkpoint.RestoreOptions) (*Restored, error) {
	dir := w.cfg.Dir
	tmp, err := os.MkdirTemp(dir, reserved+"restore-")
	if err != nil {
		return nil, fmt.Errorf("restore into %s: %w", dir, err)
	}
	defer os.RemoveAll(tmp)
	r, err := checkpoint.Restore(ctx, st, tmp, opts)
	if err != nil {
		return nil, err
	}
	o, err := originOf(r.Manifest)
	if err != nil {
		return nil, err
	}
	src := r.Dir
	if o.Kind == KindFile {
		if len(r.Manifest.Files) != 1 || r.Manifest.Files[0].Path != o.Name {
			return nil, fmt.Errorf("restore %s: a file checkpoint must hold exactly the file %q", r.Key, o.Name)
		}
		src = filepath.Join(r.Dir, o.Name)
	}
	final := filepath.Join(dir, o.Name)
	res := &Restored{Restored: r, Name: o.Name, Kind: o.Kind, Path: final}
	w.asideTorn(o.Step)
	if _, err := os.Lstat(final); err == nil {
		if sameAs(final, o.Kind, r.Manifest) == nil {
			w.log.Info("checkpoint already in the watched directory and verified: not replacing it", zap.String("path", final))
			return res, nil
		}
		if err := w.aside(o.Name, "differs from the committed checkpoint of the same name"); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(src, final); err != nil {
		return nil, fmt.Errorf("restore into %s: %w", final, err)
	}
	return res, nil
}

func originOf(m *checkpoint.Manifest) (origin, error) {
	var meta struct {
		Watch *origin `json:"watch"`
	}
	if len(m.Metadata) > 0 {
		if err := json.Unmarshal(m.Metadata, &meta); err != nil {
			return origin{}, fmt.Errorf("checkpoint %s: metadata: %w", m.ID, err)
		}
	}
	o := meta.Watch
	if o == nil {
		return origin{}, fmt.Errorf("checkpoint %s (step %d): %w: no original name to restore it under (run without --watch, or use a new --store)", m.ID, m.Step, ErrNotWatched)
	}
	if err := validName(o.Name); err != nil {
		return origin{}, fmt.Errorf("checkpoint %s: %w", m.ID, err)
	}
	if o.Kind != KindDir && o.Kind != KindFile {
		return origin{}, fmt.Errorf("checkpoint %s: unknown kind %q", m.ID, o.Kind)
	}
	o.Step = m.Step
	return *o, nil
}

// asideTorn moves newer checkpoints that lack their completion marker out
// of the way. w.mu is not held.
func (w *Watcher) asideTorn(step int64) {
	ents, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !w.namer.Match(name) {
			continue
		}
		s, err := w.namer.Step(name, false)
		m := w.marker(name, KindDir)
		if err != nil || s <= step || m == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(w.cfg.Dir, name, m)); errors.Is(err, os.ErrNotExist) {
			w.aside(name, "newer than the restored checkpoint but without "+m+": a torn write")
		}
	}
}

// aside renames DIR/name to a hidden name beside it.
func (w *Watcher) aside(name, why string) error {
	to := filepath.Join(w.cfg.Dir, reserved+"aside-"+name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(filepath.Join(w.cfg.Dir, name), to); err != nil {
		return fmt.Errorf("move %s aside: %w", name, err)
	}
	w.log.Warn("moved a local checkpoint aside", zap.String("name", name), zap.String("to", to), zap.String("why", why))
	return nil
}

// sameAs checks a local checkpoint against a manifest: the same files,
// sizes and sha256.
func sameAs(p, kind string, m *checkpoint.Manifest) error {
	fp, err := snapshot(p)
	if err != nil {
		return err
	}
	if fp.files() != len(m.Files) {
		return fmt.Errorf("%d files, manifest lists %d", fp.files(), len(m.Files))
	}
	for _, f := range m.Files {
		q := filepath.Join(p, filepath.FromSlash(f.Path))
		if kind == KindFile {
			q = p
		}
		fh, err := os.Open(q)
		if err != nil {
			return err
		}
		h := sha256.New()
		n, err := io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return err
		}
		if n != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
			return fmt.Errorf("%s differs", f.Path)
		}
	}
	return nil
}
