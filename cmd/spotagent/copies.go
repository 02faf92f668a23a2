package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/spotagent/spotagent/internal/hostcopies"
)

// newPrepareCopiesCmd is the chart's copies init container
// (internal/hostcopies): the node's directory for a pod's copies on a
// hostPath, made and handed to the trainer's uid, stale runs removed.
func newPrepareCopiesCmd() *cobra.Command {
	var o hostcopies.Options
	var root string
	var retainDays int
	cmd := &cobra.Command{
		Use:   "prepare-copies",
		Short: "make a pod's directory for its copies on a node's hostPath (the chart's init container)",
		Example: "spotagent prepare-copies --root /copies --namespace team-a --run exp1 --node 0 " +
			"--uid 1000 --retain-days 7",
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&root, "root", "/copies", "the hostPath's mount point")
	fs.StringVar(&o.Namespace, "namespace", "", "the pod's namespace (required)")
	fs.StringVar(&o.Run, "run", "", "the run: JobSet, TrainJob or the chart's runId (required)")
	fs.IntVar(&o.Node, "node", 0, "the node's rank: its directory is node-RANK")
	fs.IntVar(&o.UID, "uid", 1000, "the trainer's uid: the directory is handed to it")
	fs.IntVar(&o.GID, "gid", -1, "the trainer's gid (-1: the uid)")
	fs.IntVar(&retainDays, "retain-days", 7, "remove other runs with nothing newer (0: keep every run)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if o.Namespace == "" || o.Run == "" {
			return badUsage("--namespace and --run are required")
		}
		if retainDays < 0 || o.UID < 0 {
			return badUsage("--retain-days and --uid: want 0 or more")
		}
		if o.GID < 0 {
			o.GID = o.UID
		}
		o.Owner = os.Getuid() // root in the init container
		o.Retain = time.Duration(retainDays) * 24 * time.Hour
		r, err := os.OpenRoot(root)
		if err != nil {
			return failf(cmd, err)
		}
		defer r.Close()
		res, err := hostcopies.Prepare(r, o)
		for _, d := range res.Removed {
			fmt.Fprintf(cmd.OutOrStdout(), "copies: removed %s/%s (nothing newer than %d days)\n", root, d, retainDays)
		}
		if res.Unremoved != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "copies: stale runs left in place: %v\n", res.Unremoved)
		}
		if res.Dir != "" {
			fmt.Fprintf(cmd.OutOrStdout(), "copies: %s/%s ready for %d:%d\n", root, res.Dir, o.UID, o.GID)
		}
		if err != nil {
			return failf(cmd, err)
		}
		return nil
	}
	return cmd
}
