// Command spotagent keeps ML training on spot machines from losing work.
// This package only parses flags and wires the packages together.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spotagent/spotagent/internal/child"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// A command is one subcommand: spotagent NAME [flags]. run returns the
// process's exit code: 0 ok, 1 failed, 2 bad usage (flags), or the code
// the command documents (run: the trainer's, 75, 126, 127).
type command struct {
	name  string
	run   func(args []string) int
	usage string
}

// commands is every subcommand, in the order `spotagent help` lists them.
// Adding one is a function plus one line here; no init() registers any.
var commands = []command{
	{"run", cmdRun, "run a trainer: restore, checkpoint on notices and periodically, commit to the store"},
	{"sidecar", cmdSidecar, "serve a trainer in another container (Kubernetes sidecar): no child"},
	{"node", cmdNode, "serve every trainer on the machine, one run per run id (Kubernetes DaemonSet)"},
	{"status", cmdStatus, "ask a running agent what it is doing: child, checkpoints, notices"},
	{"list", cmdList, "list the checkpoints in a store"},
	{"restore", cmdRestore, "download and verify a checkpoint into a directory"},
	{"history", cmdHistory, "print the run journal: interruptions, restores, lost work"},
	{"report", cmdReport, "goodput of a run: where its wall time (and money) went"},
	{"fleet", cmdFleet, "every run under a store prefix: interruptions, lost work, goodput and money by cloud, instance type and zone"},
	{"watch", cmdWatch, "print interruption notices as JSON lines"},
	{"simulate", cmdSimulate, "compare checkpoint interval policies on an interruption trace"},
	{"fake-metadata", cmdFakeMetadata, "serve a fake cloud metadata service for demos and tests"},
	{"version", cmdVersion, "print the version"},
}

func main() {
	child.RunGuardIfAsked() // a guard of a trainer's process group (run); never returns
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// dispatch runs the command args[0] names. `spotagent help` (or -h,
// --help) lists the commands on stdout and exits 0; `spotagent help CMD`
// is `spotagent CMD --help`. No command or an unknown one exits 2.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "-help" || name == "help" {
		if name == "help" && len(args) > 1 {
			return dispatch([]string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(stderr, "spotagent: unknown command %q\n", name)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: spotagent COMMAND [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(w, "\nspotagent COMMAND --help prints a command's flags.")
}

func cmdVersion(args []string) int {
	fs := newFlagSet("version")
	if err := parseFlags(fs, args); err != nil {
		return flagExit(err)
	}
	fmt.Println("spotagent", version)
	return 0
}
