package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

func cmdList(args []string) int {
	return storeCommand("list", args, nil, listCheckpoints)
}

func listCheckpoints(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		return err
	}
	latest, _ := checkpoint.ReadLatest(ctx, st)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "STEP\tID\tREASON\tFILES\tBYTES\tCREATED\t")
	for _, e := range entries {
		if e.Err != nil {
			fmt.Fprintf(w, "?\t%s\tbroken: %v\t\t\t\t\n", e.Key, e.Err)
			continue
		}
		m := e.Manifest
		id := m.ID
		if e.Key == latest.Manifest {
			id += " (latest)"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\t\n", m.Step, id, m.Reason, len(m.Files), humanBytes(m.Bytes()), m.Created.Local().Format(time.DateTime))
	}
	w.Flush()
	if len(entries) == 0 {
		fmt.Fprintln(os.Stderr, "no checkpoints in", st.URI(""))
	}
	return nil
}

func cmdRestore(args []string) int {
	var dest, id string
	var force bool
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&dest, "dest", "", "directory to put the checkpoint's files in, missing or empty (required)")
		fs.StringVar(&id, "id", "", "checkpoint id, as spotagent list prints it (default: the newest complete checkpoint)")
		fs.BoolVar(&force, "force", false, "replace what --dest holds: the checkpoint is verified beside it first, then swapped in")
	}
	return storeCommand("restore", args, flags, func(ctx context.Context, st cloud.Store, log *zap.Logger) error {
		if dest == "" {
			return errors.New("--dest is required")
		}
		r, err := checkpoint.RestoreDir(ctx, st, dest, force, checkpoint.RestoreOptions{ID: id, Log: log})
		if errors.Is(err, checkpoint.ErrDestNotEmpty) {
			return fmt.Errorf("%w: --force replaces its contents", err)
		}
		if err != nil {
			return err
		}
		fmt.Printf("restored step %d (checkpoint %s, %d files, %s) into %s in %s\n", r.Manifest.Step, r.Manifest.ID,
			len(r.Manifest.Files), humanBytes(r.Bytes), r.Dir, r.Took.Round(time.Millisecond))
		return nil
	})
}

func failf(cmd string, err error) int {
	fmt.Fprintf(os.Stderr, "spotagent %s: %v\n", cmd, err)
	return 1
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
