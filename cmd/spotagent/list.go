package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

func init() {
	commands["list"] = command{cmdList, "list the checkpoints in a store"}
	commands["restore"] = command{cmdRestore, "download and verify a checkpoint"}
}

func cmdList(args []string) int {
	fs := newFlagSet("list")
	var o storeOnly
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	ctx := context.Background()
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return failf("list", err)
	}
	st, err := openStore(ctx, o.uri, o.storeOptions, log)
	if err != nil {
		return failf("list", err)
	}
	defer st.Close()
	entries, err := checkpoint.ListManifests(ctx, st)
	if err != nil {
		return failf("list", err)
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
	return 0
}

func cmdRestore(args []string) int {
	fs := newFlagSet("restore")
	var o storeOnly
	o.register(fs)
	dest := fs.String("dest", "", "directory to restore into (required)")
	id := fs.String("id", "", "checkpoint id (default: the newest complete checkpoint)")
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	if *dest == "" {
		return failf("restore", errors.New("--dest is required"))
	}
	ctx := context.Background()
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return failf("restore", err)
	}
	st, err := openStore(ctx, o.uri, o.storeOptions, log)
	if err != nil {
		return failf("restore", err)
	}
	defer st.Close()
	r, err := checkpoint.Restore(ctx, st, *dest, checkpoint.RestoreOptions{ID: *id, Log: log})
	if err != nil {
		return failf("restore", err)
	}
	fmt.Printf("restored step %d (id %s, %d files, %s) to %s in %s\n", r.Manifest.Step, r.Manifest.ID,
		len(r.Manifest.Files), humanBytes(r.Bytes), r.Dir, r.Took.Round(time.Millisecond))
	return 0
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
