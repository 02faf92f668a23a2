package render

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

// NodeStatus prints a node agent's runs, each as Status does,
// or with asJSON the reply (its runs filtered).
func NodeStatus(w io.Writer, ns *supervisor.NodeStatus, asJSON bool, now time.Time) error {
	if asJSON {
		b, err := json.Marshal(ns)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	fmt.Fprintf(w, "node agent: store prefix %s, %d runs\n", ns.StorePrefix, len(ns.Runs))
	for _, r := range ns.Runs {
		fmt.Fprintln(w)
		if r.Status == nil {
			fmt.Fprintf(w, "run: %s\nstatus: starting (its store opening or its restore running), or not answering\n", r.Key)
			continue
		}
		if r.Key != r.Status.RunID {
			fmt.Fprintf(w, "part: %s\n", r.Key)
		}
		if err := Status(w, r.Status, now); err != nil {
			return err
		}
	}
	return nil
}

// Status prints st as aligned "key: value" lines; now dates the ages.
func Status(w io.Writer, st *supervisor.Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(key, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t%s\n", key, fmt.Sprintf(format, args...))
	}
	line("run", "%s", st.RunID)
	line("store", "%s", st.Store)
	line("cloud", "%s", describeInstance(st.Cloud, st.Instance))
	if !st.Started.IsZero() {
		line("started", "%s (%s ago)", localTime(st.Started), age(now.Sub(st.Started)))
	}
	switch c := st.Child; {
	case c == nil:
		line("child", "none (the trainer runs elsewhere)")
	case c.Running:
		line("child", "pid %d, running, %d restarts", c.PID, c.Restarts)
	default:
		line("child", "pid %d, exited, %d restarts", c.PID, c.Restarts)
	}
	if st.Trainers == 0 && st.Stopping == "" && (st.Child == nil || st.Child.Running) {
		line("trainers", "0 connected: nothing is being checkpointed (the trainer needs SPOTAGENT_SOCKET and spotagent.connect())")
	} else {
		line("trainers", "%d connected", st.Trainers)
	}
	line("step", "%d (newest progress)", st.Step)
	if c := st.LastCheckpoint; c != nil {
		line("last checkpoint", "step %d, id %s, %s ago, %s", c.Step, c.ID, age(now.Sub(c.At)), schedule.HumanBytes(c.Bytes))
	} else {
		line("last checkpoint", "none committed: an interruption now would lose everything")
	}
	switch n := st.NextCheckpoint; {
	case st.Stopping != "":
		line("next checkpoint", "none (stopping)")
	case n == nil:
		line("next checkpoint", "not scheduled")
	case n.After(now):
		line("next checkpoint", "in %s (%s)", age(n.Sub(now)), localTime(*n))
	default:
		line("next checkpoint", "due now")
	}
	line("interval", "%s", st.Interval)
	if p := st.NoticePromise; p != nil {
		line("on a notice", "%s", Promise(p))
		if p.Problem != "" {
			line("  too slow", "%s", p.Problem)
			for _, a := range p.Advice {
				line("  advice", "%s", a)
			}
		}
	} else {
		line("on a notice", "no checkpoint measured yet")
	}
	line("uploading", "%d (requests awaiting the trainer: %d)", st.Uploading, st.Pending)
	if n := st.LastNotice; n != nil {
		line("notices seen", "%d, last: %s", st.NoticesSeen, describeNotice(n, now))
	} else {
		line("notices seen", "%d", st.NoticesSeen)
	}
	if st.Stopping != "" {
		line("stopping", "yes (%s)", st.Stopping)
	} else {
		line("stopping", "no")
	}
	return tw.Flush()
}

// describeInstance is the cloud and what is known of the machine.
func describeInstance(cloud metadata.Cloud, id metadata.Identity) string {
	var parts []string
	for _, s := range []string{id.InstanceID, id.Name, id.InstanceType, id.Zone, id.Lifecycle} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	if cloud == "" {
		cloud = id.Cloud
	}
	if cloud == "" && len(parts) == 0 {
		return "none (no metadata service: only SIGTERM and SIGINT announce an interruption)"
	}
	if len(parts) == 0 {
		return string(cloud)
	}
	return fmt.Sprintf("%s (%s)", cloud, strings.Join(parts, ", "))
}

// describeNotice is a notice: cloud, kind, action, when seen, deadline.
func describeNotice(n *metadata.Notice, now time.Time) string {
	s := fmt.Sprintf("%s %s", n.Cloud, n.Kind)
	if n.Action != "" {
		s += " (" + n.Action + ")"
	}
	if !n.Detected.IsZero() {
		s += fmt.Sprintf(" seen %s ago", age(now.Sub(n.Detected)))
	}
	if !n.Deadline.IsZero() {
		s += ", deadline " + localTime(n.Deadline)
	}
	return s
}

// Promise says how long a notice checkpoint is predicted to take
// and which clouds' notices it fits, e.g. "checkpoint needs ~12s (1.5
// GiB, save 2s, 500 MB/s upload, this session's newest checkpoint); fits
// aws 1m55s; NOT gcp 25s, azure 25s (notice − --margin 5s)".
func Promise(p *promise.Status) string {
	var b strings.Builder
	b.WriteString("checkpoint needs ")
	if p.LowerBound {
		b.WriteString("at least ")
	} else {
		b.WriteString("~")
	}
	b.WriteString(schedule.RoundSeconds(Seconds(p.NeedSeconds)).String())
	parts := []string{schedule.HumanBytes(p.Bytes)}
	if p.SaveSeconds > 0 {
		parts = append(parts, "save "+schedule.RoundSeconds(Seconds(p.SaveSeconds)).String())
	}
	if p.BytesPerSec > 0 {
		parts = append(parts, schedule.Rate(p.BytesPerSec)+" upload")
	}
	if p.Pipelined {
		parts = append(parts, "pipelined")
	}
	parts = append(parts, map[string]string{"checkpoint": "this session's newest checkpoint", "journal": "the journal's newest checkpoint",
		"restore": "the restore: size and download rate only"}[p.Source])
	fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	var fits, not []string
	for _, c := range p.Clouds {
		s := fmt.Sprintf("%s %s", c.Cloud, Seconds(c.BudgetSeconds).Round(time.Second))
		if c.Fits {
			fits = append(fits, s)
		} else {
			not = append(not, s)
		}
	}
	if len(fits) > 0 {
		fmt.Fprintf(&b, "; fits %s", strings.Join(fits, ", "))
	}
	if len(not) > 0 {
		fmt.Fprintf(&b, "; NOT %s", strings.Join(not, ", "))
	}
	fmt.Fprintf(&b, " (notice − --margin %s)", Seconds(p.MarginSeconds))
	return b.String()
}
