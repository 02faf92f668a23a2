// Command spotagent keeps ML training on spot machines from losing work.
// This package only parses flags and wires the packages together.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spotagent/spotagent/internal/child"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// commands builds every subcommand, in the order `spotagent help` lists
// them. Adding one is a constructor returning a *cobra.Command plus one
// line here; no init() registers any.
var commands = []func() *cobra.Command{
	newRunCmd,
	newSidecarCmd,
	newNodeCmd,
	newStatusCmd,
	newListCmd,
	newRestoreCmd,
	newHistoryCmd,
	newReportCmd,
	newFleetCmd,
	newWatchCmd,
	newSimulateCmd,
	newFakeMetadataCmd,
	newPrepareCopiesCmd,
	newVersionCmd,
}

func main() {
	child.RunGuardIfAsked() // a guard of a trainer's process group (run); never returns
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// exitCode is how a command's RunE reports its exit code: 0 ok, 1 failed,
// or the code the command documents (run: the trainer's, 75, 126, 127).
// Any other error from cobra is bad usage: exit 2.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// exit is nil for 0, else the exitCode.
func exit(code int) error {
	if code == 0 {
		return nil
	}
	return exitCode(code)
}

// usageError is a flag value that parsed but is not allowed (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// newRoot builds the command tree writing to stdout and stderr.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	cobra.EnableCommandSorting = false // `spotagent help` lists them in the table's order
	root := &cobra.Command{
		Use:           "spotagent",
		Short:         "spotagent keeps ML training on spot machines from losing work.",
		Example:       "spotagent run --store s3://my-bucket/runs/exp1 -- python3 train.py",
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("spotagent {{.Version}}\n")
	root.SetHelpFunc(helpFunc)
	root.SetFlagErrorFunc(suggestFlag) // inherited by every command
	root.Flags().Bool("version", false, "print the version")
	for _, c := range commands {
		root.AddCommand(c())
	}
	noteEnv(root)
	root.InitDefaultHelpFlag()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Short = "print a command's help: spotagent help COMMAND"
			c.Run, c.RunE = nil, func(_ *cobra.Command, args []string) error { return helpTopic(root, args) }
		case "completion":
			c.Short = "print a shell completion script: spotagent completion bash|zsh|fish"
			// cobra prints the help of a command without Run and exits 0,
			// for `completion` alone and for `completion tcsh` alike.
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(_ *cobra.Command, args []string) error {
				if len(args) == 0 {
					return errors.New("which shell? want bash, zsh, fish or powershell")
				}
				return fmt.Errorf("unknown shell %q: want bash, zsh, fish or powershell", args[0])
			}
		}
	}
	return root
}

// helpTopic is `spotagent help [COMMAND...]`: the help of the command
// named, the command list without one; an unknown one is bad usage (exit
// 2; cobra's own printed "Unknown help topic" and exited 0).
func helpTopic(root *cobra.Command, args []string) error {
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == nil || len(rest) > 0 || (cmd == root && len(args) > 0) {
		return fmt.Errorf("unknown command %q: `spotagent help` lists them", strings.Join(args, " "))
	}
	cmd.InitDefaultHelpFlag()
	return cmd.Help()
}

// execute runs the command args name and returns the exit code.
// `spotagent help`, --help or -h lists the commands on stdout (exit 0);
// `spotagent help CMD` is `spotagent CMD --help`. No command, an unknown
// one, a bad flag or a flag value that is not allowed exit 2, with the
// reason on stderr.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	if len(args) == 0 {
		rootHelp(stderr, root)
		return 2
	}
	if cmd, _, err := root.Find(args); err == nil && cmd != root {
		args = normalizeArgs(cmd, args, stderr)
		if err := applyEnv(cmd); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
			return 2
		}
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return 2
}

// failf prints "spotagent CMD: err" on stderr; its exit code is 2 for a
// usageError, else 1.
func failf(cmd *cobra.Command, err error) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", cmd.CommandPath(), fromEnv(cmd, err))
	if errors.As(err, new(usageError)) {
		return exitCode(2)
	}
	if se := (signalExit{}); errors.As(err, &se) {
		return exitCode(se.code())
	}
	return exitCode(1)
}

// fromEnv is err's text, naming the environment variable a flag's value
// came from when err is about that flag ("--interval: want auto..."
// reads "SPOTAGENT_INTERVAL=\"5\": --interval: ..."): a value the user
// never typed on the command line is otherwise hard to find.
func fromEnv(cmd *cobra.Command, err error) string {
	text := err.Error()
	name, ok := strings.CutPrefix(text, "--")
	if !ok {
		return text
	}
	if i := strings.IndexAny(name, " :="); i >= 0 {
		name = name[:i]
	}
	f := cmd.Flags().Lookup(name)
	if f == nil || f.Changed || f.Annotations[envSetKey] == nil {
		return text
	}
	return fmt.Sprintf("%s=%q: %s", envName(name), f.Value.String(), text)
}

// badUsage is a usageError formatted like fmt.Errorf.
func badUsage(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "print the version",
		Example: "spotagent version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "spotagent", version)
			return nil
		},
	}
}

// failCode is failf for a function that returns an exit code.
func failCode(cmd *cobra.Command, err error) int {
	var code exitCode
	errors.As(failf(cmd, err), &code)
	return int(code)
}
