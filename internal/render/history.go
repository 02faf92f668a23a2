package render

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Journal prints the run's summary, its interruptions and its
// restores; a table with no rows is left out.
func Journal(out io.Writer, j *journal.Journal) {
	s := j.Stats
	// RunSeconds is time on machines, not training kept: a trainer that
	// crashed at once ran 3s and trained nothing (#47 said "3s trained").
	kept := ""
	if s.Checkpoints == 0 {
		kept = " (none of it kept: no checkpoint committed)"
	}
	fmt.Fprintf(out, "run %s: %s, %s committed, %d failed, %s on machines%s, checkpoint cost %.1fs, upload %s/s\n",
		j.RunID, Plural(len(j.Sessions), "session"), Plural(s.Checkpoints, "checkpoint"), s.Failures, (time.Duration(s.RunSeconds) * time.Second).String(),
		kept, s.CostSeconds, schedule.HumanBytes(int64(s.BytesPerSec)))
	if len(j.Interruptions) == 0 {
		fmt.Fprintln(out, "no interruptions")
	} else {
		fmt.Fprintln(out)
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "INTERRUPTION\tCLOUD\tKIND\tINSTANCE\tDEADLINE IN\tSAVED IN\tCOMMITTED IN\tSTEP\tBYTES\tOK\tLOST\t")
		for _, in := range j.Interruptions {
			since := func(t *time.Time) string {
				if t == nil {
					return "-"
				}
				return t.Sub(in.Detected).Round(10 * time.Millisecond).String()
			}
			lost := Seconds(in.LostSeconds).Round(time.Second).String()
			if in.LostSteps > 0 {
				lost += lostSteps(in)
			}
			ok, step, size := "yes", fmt.Sprint(in.Step), schedule.HumanBytes(in.Bytes)
			if !in.CommitOK {
				ok = "NO: " + in.Error
			}
			if !in.CommitOK && in.Step == 0 && in.Bytes == 0 {
				step, size = "-", "-" // nothing was saved: not step 0, 0 bytes
			}
			inst := in.InstanceID
			if in.InstanceType != "" {
				inst += " " + in.InstanceType
			}
			if in.Zone != "" {
				inst += " " + in.Zone
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", in.Detected.Local().Format(time.DateTime),
				in.Cloud, in.Kind, OrDash(inst), since(in.Deadline), since(in.Done), since(in.Committed), step,
				size, ok, lost)
		}
		w.Flush()
	}
	if len(j.Restores) == 0 {
		fmt.Fprintln(out, "no restores")
		return
	}
	nodes := false // a multi-node job: say which node each restore was
	for _, r := range j.Restores {
		nodes = nodes || r.Node != ""
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if nodes {
		fmt.Fprint(w, "NODE\t")
	}
	fmt.Fprintln(w, "RESTORE\tCHECKPOINT\tSTEP\tBYTES\tFROM\tSTORE BYTES\tTOOK\tSKIPPED\t")
	for _, r := range j.Restores {
		if nodes {
			fmt.Fprintf(w, "%s\t", OrDash(r.Node))
		}
		storeBytes := "-" // a journal from before sources were recorded
		if r.From != nil {
			storeBytes = schedule.HumanBytes(r.From[checkpoint.FromStore])
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t\n", r.At.Local().Format(time.DateTime), r.CheckpointID, r.Step,
			schedule.HumanBytes(r.Bytes), OrDash(r.Sources()), storeBytes, Seconds(r.Seconds).Round(time.Millisecond), len(r.Skipped))
	}
	w.Flush()
}

// lostSteps says how many steps an interruption lost, and how that was
// counted when the trainer did not report it (zero-code mode).
func lostSteps(in journal.Interruption) string {
	switch in.LostStepsFrom {
	case journal.LostFromEstimate:
		return fmt.Sprintf(" (~%d steps, estimated)", in.LostSteps)
	case journal.LostFromDir:
		return fmt.Sprintf(" (at least %d steps, seen in DIR)", in.LostSteps)
	}
	return fmt.Sprintf(" (%d steps)", in.LostSteps)
}
