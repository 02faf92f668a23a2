package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"

	"github.com/spotagent/spotagent/internal/render"
)

func newHistoryCmd() *cobra.Command {
	var o readOptions
	cmd := &cobra.Command{
		Use:     "history",
		Short:   "print the run journal: interruptions, restores, lost work",
		Example: "spotagent history --store s3://my-bucket/runs/exp1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, nil, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
				j, err := checkpoint.ReadJournal(ctx, st, "")
				if err != nil {
					return err
				}
				if len(j.Sessions) == 0 {
					return fmt.Errorf("no run journal in %s", st.URI(""))
				}
				out := cmd.OutOrStdout()
				render.Journal(out, j)
				return printJobCheckpoints(ctx, st, out)
			})
		},
	}
	o.register(cmd)
	return cmd
}

// printJobCheckpoints lists the checkpoints made of parts, with their
// parts: which node wrote which ranks' files.
func printJobCheckpoints(ctx context.Context, st cloud.Store, out io.Writer) error {
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		return err
	}
	var jobs []checkpoint.Entry
	for _, e := range entries {
		if e.Err == nil && len(e.Manifest.Parts) > 0 {
			jobs = append(jobs, e)
		}
	}
	incomplete, err := checkpoint.ListIncomplete(ctx, st)
	if err != nil {
		return err
	}
	if len(jobs) == 0 && len(incomplete) == 0 {
		return nil
	}
	latest, _ := checkpoint.ReadLatest(ctx, st)
	fmt.Fprintln(out)
	fmt.Fprintln(out, "checkpoints made of parts (one per node):")
	render.Checkpoints(out, jobs, incomplete, latest)
	return nil
}
