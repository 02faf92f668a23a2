package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

func cmdHistory(args []string) int {
	return storeCommand("history", args, nil, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
		j, err := checkpoint.ReadJournal(ctx, st, "")
		if err != nil {
			return err
		}
		if len(j.Sessions) == 0 {
			fmt.Fprintln(os.Stderr, "no run journal in", st.URI(""))
			return nil
		}
		printJournal(j)
		return printJobCheckpoints(ctx, st)
	})
}

// printJobCheckpoints lists the checkpoints made of parts, with their
// parts: which node wrote which ranks' files.
func printJobCheckpoints(ctx context.Context, st cloud.Store) error {
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
	fmt.Println()
	fmt.Println("checkpoints made of parts (one per node):")
	printCheckpoints(os.Stdout, jobs, incomplete, latest)
	return nil
}

func printJournal(j *checkpoint.Journal) {
	s := j.Stats
	fmt.Printf("run %s: %d sessions, %d checkpoints committed, %d failed, %s trained, checkpoint cost %.1fs, upload %s/s\n\n",
		j.RunID, len(j.Sessions), s.Checkpoints, s.Failures, (time.Duration(s.RunSeconds) * time.Second).String(),
		s.CostSeconds, humanBytes(int64(s.BytesPerSec)))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "INTERRUPTION\tCLOUD\tKIND\tINSTANCE\tDEADLINE IN\tSAVED IN\tCOMMITTED IN\tSTEP\tBYTES\tOK\tLOST\t")
	for _, in := range j.Interruptions {
		since := func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return t.Sub(in.Detected).Round(10 * time.Millisecond).String()
		}
		lost := seconds(in.LostSeconds).Round(time.Second).String()
		if in.LostSteps > 0 {
			lost += fmt.Sprintf(" (%d steps)", in.LostSteps)
		}
		ok := "yes"
		if !in.CommitOK {
			ok = "NO: " + in.Error
		}
		inst := in.InstanceID
		if in.InstanceType != "" {
			inst += " " + in.InstanceType
		}
		if in.Zone != "" {
			inst += " " + in.Zone
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", in.Detected.Local().Format(time.DateTime),
			in.Cloud, in.Kind, orDash(inst), since(in.Deadline), since(in.Done), since(in.Committed), in.Step,
			humanBytes(in.Bytes), ok, lost)
	}
	w.Flush()
	fmt.Println()
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "RESTORE\tCHECKPOINT\tSTEP\tBYTES\tTOOK\tSKIPPED\t")
	for _, r := range j.Restores {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t\n", r.At.Local().Format(time.DateTime), r.CheckpointID, r.Step,
			humanBytes(r.Bytes), seconds(r.Seconds).Round(time.Millisecond), len(r.Skipped))
	}
	w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
