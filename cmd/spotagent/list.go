package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/schedule"

	"github.com/spotagent/spotagent/internal/render"
)

func newListCmd() *cobra.Command {
	var o readOptions
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "list the checkpoints in a store",
		Example: "spotagent list --store s3://my-bucket/runs/exp1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, nil, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
				return listCheckpoints(ctx, st, cmd.OutOrStdout())
			})
		},
	}
	o.register(cmd)
	return cmd
}

func listCheckpoints(ctx context.Context, st cloud.Store, out io.Writer) error {
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		return err
	}
	incomplete, err := checkpoint.ListIncomplete(ctx, st)
	if err != nil {
		return err
	}
	if len(entries) == 0 && len(incomplete) == 0 {
		return fmt.Errorf("no checkpoints in %s yet", st.URI(""))
	}
	latest, _ := checkpoint.ReadLatest(ctx, st)
	render.Checkpoints(out, entries, incomplete, latest)
	return nil
}

func newRestoreCmd() *cobra.Command {
	var o readOptions
	var dest, id, part string
	var force bool
	cmd := &cobra.Command{
		Use:     "restore",
		Short:   "download and verify a checkpoint into a directory",
		Example: "spotagent restore --store s3://my-bucket/runs/exp1 --dest ./ckpt",
		Args:    cobra.NoArgs,
	}
	check := func() error {
		if dest == "" {
			return badUsage("--dest is required")
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		// Ctrl-C or SIGTERM cancels the download: RestoreDir removes its
		// staging directory, and the exit is 128+N with a message.
		ctx, caught, stopSignals := signalContext(cmd.Context())
		defer stopSignals()
		cmd.SetContext(ctx)
		return o.run(cmd, check, func(ctx context.Context, st cloud.Store, log *zap.Logger) error {
			if testHookRestoreStore != nil {
				st = testHookRestoreStore(st)
			}
			removeStaleStages(dest, log)
			var want *checkpoint.Manifest // what will most likely be restored, for the progress total
			if id != "" {
				m, err := knownID(ctx, st, id)
				if err != nil {
					return err
				}
				want = m
			} else if l, err := checkpoint.ReadLatest(ctx, st); err == nil {
				want, _ = checkpoint.ReadManifest(ctx, st, l.Manifest)
			}
			var total int64
			var files int
			if want != nil {
				total, files = want.Bytes(), len(want.Files)
			}
			plog, err := newLoggerTo(cmd.ErrOrStderr(), o.logFormat, "info") // progress lines whatever --log-level says
			if err != nil {
				return err
			}
			cs := &countingStore{Store: st}
			stop := showProgress(cs, "restore", total, files, cmd.ErrOrStderr(), plog)
			r, err := checkpoint.RestoreDir(ctx, cs, dest, force, checkpoint.RestoreOptions{ID: id, Log: log, Part: part})
			stop()
			if s := caught(); s != nil && err != nil {
				return interrupted(s, dest)
			}
			if errors.Is(err, checkpoint.ErrDestNotEmpty) {
				return fmt.Errorf("%w: --force replaces its contents", err)
			}
			if errors.Is(err, checkpoint.ErrNoCheckpoint) && id == "" {
				return fmt.Errorf("%w in %s: `spotagent list --store %s` shows what it holds", err, st.URI(""), o.uri)
			}
			if err != nil {
				return err
			}
			files = len(r.Manifest.Files)
			if len(r.Parts) > 0 {
				files = 0
				for _, p := range r.Parts {
					files += r.Manifest.Part(p).Files
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "restored step %d (checkpoint %s, %s, %s) into %s in %s\n", r.Manifest.Step, r.Manifest.ID,
				render.Plural(files, "file"), schedule.HumanBytes(r.Bytes), r.Dir, r.Took.Round(time.Millisecond))
			if len(r.Parts) > 0 {
				fmt.Fprintf(out, "parts: %s\n", strings.Join(r.Parts, ", "))
			}
			return nil
		})
	}
	fs := cmd.Flags()
	o.register(cmd)
	fs.StringVar(&dest, "dest", "", "directory to put the checkpoint's files in, missing or empty")
	fs.StringVar(&id, "id", "", "checkpoint id, as spotagent list prints it (default: the newest complete checkpoint)")
	fs.BoolVar(&force, "force", false, "replace what --dest holds: the checkpoint is verified beside it first, then swapped in")
	fs.StringVar(&part, "part", "", "of a checkpoint made of parts, restore only this part's files (node-<k>; default: every part's)")
	inGroup(fs, groupRequired, "dest")
	return cmd
}

// knownID returns the manifest of checkpoint id. It fails unless some manifest, or some job checkpoint still
// missing parts, in st has the id: an unknown id is a typo, not a store
// without complete checkpoints.
func knownID(ctx context.Context, st cloud.Store, id string) (*checkpoint.Manifest, error) {
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Manifest != nil && e.Manifest.ID == id {
			return e.Manifest, nil
		}
	}
	incomplete, err := checkpoint.ListIncomplete(ctx, st)
	if err != nil {
		return nil, err
	}
	for _, in := range incomplete {
		if in.ID == id {
			return nil, fmt.Errorf("checkpoint %s in %s is incomplete (parts missing): it cannot be restored", id, st.URI(""))
		}
	}
	return nil, fmt.Errorf("no checkpoint with id %q in %s: `spotagent list --store %s` prints the ids", id, st.URI(""), st.URI(""))
}
