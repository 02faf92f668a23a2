package restore

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// ErrNoPart means the newest checkpoint of a job has no part of the node
// restoring it: restore fails rather than hand that node another node's
// files.
var ErrNoPart = errors.New("no part for this node:")

// ErrPathClash means two parts of a job checkpoint hold different files
// at one path, so they cannot be restored into one directory: restore one
// part at a time (Options.Part).
var ErrPathClash = errors.New("parts hold different files at one path")

// selectFiles returns the manifest restore fetches for part ("": every
// part) and the parts it holds. Every part into one directory: a path in
// several parts must be the same file in each (it is fetched once).
func selectFiles(m *checkpoint.Manifest, part string, log *zap.Logger) (*checkpoint.Manifest, []string, error) {
	if len(m.Parts) == 0 {
		if part != "" {
			log.Warn("checkpoint has no parts: restoring all of it", zap.String("id", m.ID), zap.String("part", part))
		}
		return m, nil, nil
	}
	view := *m
	view.Files = nil
	var parts []string
	if part != "" {
		if m.Part(part) == nil {
			// Another node's files are not this node's state: resuming
			// from them would mix ranks. A changed topology restores
			// every part on purpose (Options.Part "").
			var have []string
			for _, p := range m.Parts {
				have = append(have, p.Node)
			}
			return nil, nil, fmt.Errorf("checkpoint %d-%s has parts %v: %w %s (to restore every part, as after a change of topology, use --restore all)",
				m.Step, m.ID, have, ErrNoPart, part)
		}
		parts = []string{part}
	}
	byPath := map[string]checkpoint.File{}
	for _, f := range m.Files {
		if part != "" && f.Part != part {
			continue
		}
		if prev, ok := byPath[f.Path]; ok {
			if !prev.SameContent(f) {
				return nil, nil, fmt.Errorf("%q in parts %s and %s: %w", f.Path, prev.Part, f.Part, ErrPathClash)
			}
			continue
		}
		byPath[f.Path] = f
		view.Files = append(view.Files, f)
	}
	if part == "" {
		for _, p := range m.Parts {
			parts = append(parts, p.Node)
		}
	}
	// One directory: a path that is another part's directory cannot be laid out.
	flat := make([]checkpoint.File, len(view.Files))
	for i, f := range view.Files {
		flat[i] = f
		flat[i].Part = ""
	}
	if err := checkpoint.ValidateFiles(flat); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrPathClash, err)
	}
	return &view, parts, nil
}

// checkParts makes sure every object of m that restore does not fetch
// (view lists those it does, and verifies them as it goes) exists with its
// size: a job checkpoint with a part missing or cut short is not complete.
// Such a checkpoint is ErrCorrupt or cloud.ErrNotExist, as a damaged one.
func checkParts(ctx context.Context, st cloud.Store, m, view *checkpoint.Manifest) error {
	fetched := map[string]bool{}
	for _, f := range view.Files {
		fetched[f.Key] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, f := range m.Files {
		if fetched[f.Key] {
			continue
		}
		g.Go(func() error {
			info, err := st.Stat(gctx, f.Key)
			if err != nil {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, err)
			}
			if info.Size != f.Size {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, checkpoint.SizeMismatch(info.Size, f.Size))
			}
			return nil
		})
	}
	return g.Wait()
}
