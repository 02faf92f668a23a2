package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

// defaultSocket is the agent's socket path when --socket is not given.
func defaultSocket(runID string) string {
	return filepath.Join(socketDir(), runID+".sock")
}

// socketDir holds the default sockets of one user's agents:
// $XDG_RUNTIME_DIR/spotagent when XDG_RUNTIME_DIR is a directory of this
// user's (as systemd-logind makes it), else $TMPDIR/spotagent-UID. The
// agent refuses that directory unless it is its own and 0700.
func socketDir() string {
	if xdg := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(xdg) {
		if fi, err := os.Lstat(xdg); err == nil && fi.IsDir() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == os.Geteuid() {
				return filepath.Join(xdg, "spotagent")
			}
		}
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("spotagent-%d", os.Geteuid()))
}

func newStatusCmd() *cobra.Command {
	var socket, runID, store string
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "ask a running agent what it is doing: child, checkpoints, notices (a node agent: each of its runs)",
		Example: "spotagent status --run-id exp1\nspotagent status --socket /var/run/spotagent/agent.sock --run-id exp1   # one run of a node agent",
		Args:    cobra.NoArgs,
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		stdout := cmd.OutOrStdout()
		path, err := statusSocket(socket, runID, store)
		if err != nil {
			return failf(cmd, err)
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		raw, err := queryStatus(ctx, path)
		if err != nil {
			return failf(cmd, err)
		}
		if ns, ok, err := nodeStatus(raw, runID); ok || err != nil {
			if err == nil {
				err = printNodeStatus(stdout, ns, asJSON, time.Now())
			}
			if err != nil {
				return failf(cmd, err)
			}
			return nil
		}
		if asJSON {
			fmt.Fprintf(stdout, "%s\n", raw)
			return nil
		}
		var st supervisor.Status
		if err := json.Unmarshal(raw, &st); err != nil {
			return failf(cmd, fmt.Errorf("decode status: %w", err))
		}
		if err := writeStatus(stdout, &st, time.Now()); err != nil {
			return failf(cmd, err)
		}
		return nil
	}
	fs := cmd.Flags()
	fs.StringVar(&socket, "socket", "", "the agent's socket (default: $XDG_RUNTIME_DIR/spotagent/RUN-ID.sock or $TMPDIR/spotagent-UID/RUN-ID.sock, or the only socket there)")
	fs.StringVar(&runID, "run-id", "", "run id of the agent, to find its default socket; against a node agent, the run to show (default: every run)")
	fs.StringVar(&store, "store", "", "the agent's --store, to find its default socket when --run-id is not set")
	fs.BoolVar(&asJSON, "json", false, "print the agent's status reply as JSON")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the agent")
	return cmd
}

// statusSocket picks the socket as the agent does: --socket, else the
// default for --run-id (or the run id --store implies), else the only
// socket in the default directory.
func statusSocket(socket, runID, store string) (string, error) {
	switch {
	case socket != "":
		return socket, nil
	case runID != "":
		p := defaultSocket(runID)
		if _, err := os.Stat(p); err != nil {
			if node := defaultSocket("node"); fileExists(node) {
				return node, nil // spotagent node's default socket: the run is one of its runs
			}
		}
		return p, nil
	case store != "":
		return defaultSocket(defaultRunID(store)), nil
	}
	dir := socketDir()
	found, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no agent socket in %s: is spotagent running as this user? (or pass --socket or --run-id)", dir)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%d agent sockets in %s (%s): pick one with --run-id or --socket", len(found), dir, strings.Join(names(found), ", "))
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// nodeStatus decodes raw as a node agent's reply (ok false: an agent of
// one run), keeping only the runs whose id (or key) is runID when set.
func nodeStatus(raw json.RawMessage, runID string) (*supervisor.NodeStatus, bool, error) {
	var probe struct {
		Node bool `json:"node"`
	}
	if json.Unmarshal(raw, &probe) != nil || !probe.Node {
		return nil, false, nil
	}
	var ns supervisor.NodeStatus
	if err := json.Unmarshal(raw, &ns); err != nil {
		return nil, true, fmt.Errorf("decode node status: %w", err)
	}
	if runID == "" {
		return &ns, true, nil
	}
	var keep []supervisor.NodeRunStatus
	keys := make([]string, 0, len(ns.Runs))
	for _, r := range ns.Runs {
		keys = append(keys, r.Key)
		if id, _, _ := strings.Cut(r.Key, "/"); id == runID || r.Key == runID {
			keep = append(keep, r)
		}
	}
	if len(keep) == 0 {
		served := "none"
		if len(keys) > 0 {
			served = strings.Join(keys, ", ")
		}
		return nil, true, fmt.Errorf("the node agent serves no run %q (its runs: %s)", runID, served)
	}
	ns.Runs = keep
	return &ns, true, nil
}

// printNodeStatus prints a node agent's runs, each as writeStatus does,
// or with asJSON the reply (its runs filtered).
func printNodeStatus(w io.Writer, ns *supervisor.NodeStatus, asJSON bool, now time.Time) error {
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
		if err := writeStatus(w, r.Status, now); err != nil {
			return err
		}
	}
	return nil
}

func names(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = strings.TrimSuffix(filepath.Base(p), ".sock")
	}
	return out
}

// queryStatus asks the agent at path for its status (protocol.Client.Status).
func queryStatus(ctx context.Context, path string) (json.RawMessage, error) {
	c, err := protocol.Dial(ctx, path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Status(ctx)
}

// writeStatus prints st as aligned "key: value" lines; now dates the ages.
func writeStatus(w io.Writer, st *supervisor.Status, now time.Time) error {
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
	line("trainers", "%d connected", st.Trainers)
	line("step", "%d (newest progress)", st.Step)
	if c := st.LastCheckpoint; c != nil {
		line("last checkpoint", "step %d, id %s, %s ago, %s", c.Step, c.ID, age(now.Sub(c.At)), schedule.HumanBytes(c.Bytes))
	} else {
		line("last checkpoint", "none committed yet")
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
		line("on a notice", "%s", describePromise(p))
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

func localTime(t time.Time) string { return t.Local().Format(time.DateTime) }

// age rounds d for reading: seconds under an hour, minutes above.
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}

// describePromise says how long a notice checkpoint is predicted to take
// and which clouds' notices it fits, e.g. "checkpoint needs ~12s (1.5
// GiB, save 2s, 500 MB/s upload, this session's newest checkpoint); fits
// aws 1m55s; NOT gcp 25s, azure 25s (notice − --margin 5s)".
func describePromise(p *promise.Status) string {
	var b strings.Builder
	b.WriteString("checkpoint needs ")
	if p.LowerBound {
		b.WriteString("at least ")
	} else {
		b.WriteString("~")
	}
	b.WriteString(schedule.RoundSeconds(seconds(p.NeedSeconds)).String())
	parts := []string{schedule.HumanBytes(p.Bytes)}
	if p.SaveSeconds > 0 {
		parts = append(parts, "save "+schedule.RoundSeconds(seconds(p.SaveSeconds)).String())
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
		s := fmt.Sprintf("%s %s", c.Cloud, seconds(c.BudgetSeconds).Round(time.Second))
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
	fmt.Fprintf(&b, " (notice − --margin %s)", seconds(p.MarginSeconds))
	return b.String()
}
