package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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
	incomplete, err := checkpoint.ListIncomplete(ctx, st)
	if err != nil {
		return err
	}
	latest, _ := checkpoint.ReadLatest(ctx, st)
	printCheckpoints(os.Stdout, entries, incomplete, latest)
	if len(entries) == 0 && len(incomplete) == 0 {
		fmt.Fprintln(os.Stderr, "no checkpoints in", st.URI(""))
	}
	return nil
}

// printCheckpoints prints one row per checkpoint, newest first, each job
// checkpoint followed by a row per part; then the job checkpoints whose
// manifest is missing (parts still arriving, or never will).
func printCheckpoints(out io.Writer, entries []checkpoint.Entry, incomplete []checkpoint.Incomplete, latest checkpoint.Latest) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
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
		for _, p := range m.Parts {
			fmt.Fprintf(w, "\t  part %s\tranks %s\t%d\t%s\t\t\n", p.Node, ranges(p.Ranks), p.Files, humanBytes(p.Bytes))
		}
	}
	for _, in := range incomplete {
		why := "incomplete: no manifest"
		if len(in.Missing) > 0 {
			why += ", ranks " + ranges(in.Missing) + " missing"
		}
		if in.Err != nil {
			why += fmt.Sprintf(", broken part: %v", in.Err)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t\t\t\t\n", in.Step, in.ID, why)
		for _, p := range in.Parts {
			var n int64
			for _, f := range p.Files {
				n += f.Size
			}
			fmt.Fprintf(w, "\t  part %s\tranks %s of %d\t%d\t%s\t%s\t\n", p.Node, ranges(p.Ranks), p.WorldSize, len(p.Files), humanBytes(n), p.Created.Local().Format(time.DateTime))
		}
	}
	w.Flush()
}

// ranges prints sorted ranks compactly: 0-3,6,8-9.
func ranges(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ranks[i], ranks[j])
		} else {
			fmt.Fprintf(&b, "%d", ranks[i])
		}
		i = j + 1
	}
	return b.String()
}

func cmdRestore(args []string) int {
	var dest, id, part string
	var force bool
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&dest, "dest", "", "directory to put the checkpoint's files in, missing or empty (required)")
		fs.StringVar(&id, "id", "", "checkpoint id, as spotagent list prints it (default: the newest complete checkpoint)")
		fs.BoolVar(&force, "force", false, "replace what --dest holds: the checkpoint is verified beside it first, then swapped in")
		fs.StringVar(&part, "part", "", "of a checkpoint made of parts, restore only this part's files (node-<k>; default: every part's)")
	}
	return storeCommand("restore", args, flags, func(ctx context.Context, st cloud.Store, log *zap.Logger) error {
		if dest == "" {
			return errors.New("--dest is required")
		}
		r, err := checkpoint.RestoreDir(ctx, st, dest, force, checkpoint.RestoreOptions{ID: id, Log: log, Part: part})
		if errors.Is(err, checkpoint.ErrDestNotEmpty) {
			return fmt.Errorf("%w: --force replaces its contents", err)
		}
		if err != nil {
			return err
		}
		files := len(r.Manifest.Files)
		if len(r.Parts) > 0 {
			files = 0
			for _, p := range r.Parts {
				files += r.Manifest.Part(p).Files
			}
		}
		fmt.Printf("restored step %d (checkpoint %s, %d files, %s) into %s in %s\n", r.Manifest.Step, r.Manifest.ID,
			files, humanBytes(r.Bytes), r.Dir, r.Took.Round(time.Millisecond))
		if len(r.Parts) > 0 {
			fmt.Printf("parts: %s\n", strings.Join(r.Parts, ", "))
		}
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
