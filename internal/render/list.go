package render

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Checkpoints prints one row per checkpoint, newest first, each job
// checkpoint followed by a row per part; then the job checkpoints whose
// manifest is missing (parts still arriving, or never will).
func Checkpoints(out io.Writer, entries []checkpoint.Entry, incomplete []checkpoint.Incomplete, latest checkpoint.Latest) {
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
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\t\n", m.Step, id, m.Reason, len(m.Files), schedule.HumanBytes(m.Bytes()), m.Created.Local().Format(time.DateTime))
		for _, p := range m.Parts {
			fmt.Fprintf(w, "\t  part %s\tranks %s\t%d\t%s\t\t\n", p.Node, Ranges(p.Ranks), p.Files, schedule.HumanBytes(p.Bytes))
		}
	}
	for _, in := range incomplete {
		why := "incomplete: no manifest"
		if len(in.Missing) > 0 {
			why += ", ranks " + Ranges(in.Missing) + " missing"
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
			fmt.Fprintf(w, "\t  part %s\tranks %s of %d\t%d\t%s\t%s\t\n", p.Node, Ranges(p.Ranks), p.WorldSize, len(p.Files), schedule.HumanBytes(n), p.Created.Local().Format(time.DateTime))
		}
	}
	w.Flush()
}

// Ranges prints sorted ranks compactly: 0-3,6,8-9.
func Ranges(ranks []int) string {
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
