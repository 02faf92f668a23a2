package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor"

	"github.com/spotagent/spotagent/internal/render"
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
				err = render.NodeStatus(stdout, ns, asJSON, time.Now())
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
		if err := render.Status(stdout, &st, time.Now()); err != nil {
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
