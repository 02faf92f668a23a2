package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flag groups, in the order a command's help prints them. A flag is put in
// one with inGroup; flags in none print under "flags".
const (
	groupRequired  = "required"
	groupNotices   = "notices"
	groupSchedule  = "schedule"
	groupTrainer   = "trainer"
	groupStore     = "store tuning"
	groupWatch     = "watch (zero-code mode, docs/watch.md)"
	groupMultiNode = "multi-node (docs/distributed.md)"
	groupSecurity  = "socket and security"
	groupAdvice    = "advice"
	groupOutput    = "output"
	groupStoreURI  = "store"
	groupSynthetic = "synthetic traces" // simulate
)

var groupOrder = []string{groupRequired, "", groupStoreURI, groupNotices, groupSchedule, groupTrainer, groupStore, groupWatch,
	groupMultiNode, groupSecurity, groupAdvice, groupSynthetic, groupOutput}

const (
	groupKey  = "spotagent_group"
	envSetKey = "spotagent_env" // the flag's value came from its environment variable
)

// inGroup files the named flags of fs under group in the help.
func inGroup(fs *pflag.FlagSet, group string, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, groupKey, []string{group}); err != nil {
			panic(err) // a flag name misspelt in this package
		}
	}
}

// envName is the environment variable a flag takes its default from:
// SPOTAGENT_<FLAG>, upper case, dashes as underscores.
func envName(flagName string) string {
	return "SPOTAGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// noEnvKey marks a flag no environment variable sets: fleet's --run-id,
// whose SPOTAGENT_RUN_ID the agent exports to every trainer (a `spotagent
// fleet` run from a trainer's shell would silently count one run).
const noEnvKey = "spotagent_noenv"

// skipEnv are cobra's own flags and those marked noEnvKey: no environment
// variable sets them.
func skipEnv(f *pflag.Flag) bool {
	return f.Name == "help" || f.Name == "version" || f.Annotations[noEnvKey] != nil
}

// noteEnv appends "(env SPOTAGENT_<FLAG>)" to the usage of every flag of
// cmd and its subcommands (deploy/ reads these notes from `run -h`).
func noteEnv(cmd *cobra.Command) {
	cmd.Flags().SortFlags = false // the help lists them as registered
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if !skipEnv(f) {
			f.Usage += " (env " + envName(f.Name) + ")"
		}
	})
	for _, c := range cmd.Commands() {
		noteEnv(c)
	}
}

// applyEnv sets every flag of cmd whose environment variable is set, before
// the command line is parsed (so the command line wins), and shows that
// value as the flag's default in the help.
func applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || skipEnv(f) {
			return
		}
		env := envName(f.Name)
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if e := f.Value.Set(v); e != nil {
			err = fmt.Errorf("%s=%q: %w", env, v, e)
			return
		}
		f.DefValue = v
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[envSetKey] = []string{"1"}
	})
	return err
}

// isSet reports whether the flag was given on the command line or by its
// environment variable.
func isSet(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && (f.Changed || f.Annotations[envSetKey] != nil)
}

// normalizeArgs rewrites the single-dash long flags that Go's flag package
// accepted (-store URI, -dest=DIR, -help) to the double-dash form pflag
// wants, with one warning on stderr. Earlier releases printed `-store` in
// their help, so scripts written from it keep working. It stops at "--"
// and at the first argument that is neither a flag nor a flag's value nor
// the command's name: `run`'s trainer command and its flags are never
// touched.
func normalizeArgs(cmd *cobra.Command, args []string, stderr io.Writer) []string {
	out := slices.Clone(args)
	var old []string
	named := false
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if !named && a == cmd.Name() {
				named = true
				continue
			}
			break
		}
		double := strings.HasPrefix(a, "--")
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := cmd.Flags().Lookup(name)
		if !double && len(name) > 1 && (f != nil || name == "help") {
			out[i] = "-" + a
			old = append(old, a)
		}
		if !double && len(name) == 1 {
			f = cmd.Flags().ShorthandLookup(name)
		}
		if f != nil && !hasValue && f.NoOptDefVal == "" {
			i++ // its value, whatever it looks like
		}
	}
	if len(old) > 0 {
		fmt.Fprintf(stderr, "spotagent: %s: single-dash long flags are deprecated; use two dashes (--%s)\n",
			strings.Join(old, " "), strings.TrimLeft(old[0], "-"))
	}
	return out
}

// helpFunc prints a command's help: usage, a one-line example, what it
// does, then its flags by group.
func helpFunc(cmd *cobra.Command, _ []string) {
	w := cmd.OutOrStdout()
	if !cmd.HasParent() {
		rootHelp(w, cmd)
		return
	}
	fmt.Fprintf(w, "usage: %s\n", cmd.UseLine())
	if cmd.Example != "" {
		fmt.Fprintf(w, "e.g.   %s\n", cmd.Example)
	}
	fmt.Fprintln(w)
	if cmd.Long != "" {
		fmt.Fprintln(w, strings.TrimSpace(cmd.Long))
	} else {
		fmt.Fprintln(w, upperFirst(cmd.Short)+".")
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\ncommands:")
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-14s %s\n", c.Name(), c.Short)
			}
		}
	}
	groups := map[string]*pflag.FlagSet{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		g := ""
		if v := f.Annotations[groupKey]; len(v) > 0 {
			g = v[0]
		}
		if groups[g] == nil {
			groups[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
			groups[g].SortFlags = false
		}
		groups[g].AddFlag(f)
	})
	order := slices.Clone(groupOrder)
	for g := range groups { // a group missing from groupOrder still prints, last
		if !slices.Contains(order, g) {
			order = append(order, g)
		}
	}
	slices.Sort(order[len(groupOrder):])
	for _, g := range order {
		fs := groups[g]
		if fs == nil {
			continue
		}
		title := g
		if title == "" {
			title = "flags"
		}
		// Not wrapped: "(env SPOTAGENT_X)" stays on its flag's line.
		fmt.Fprintf(w, "\n%s:\n%s", title, fs.FlagUsagesWrapped(0))
	}
	fmt.Fprintln(w, "\nEvery flag also takes its default from the environment variable named after it.")
}

func rootHelp(w io.Writer, root *cobra.Command) {
	fmt.Fprintf(w, "%s\n\nusage: spotagent COMMAND [flags]\ne.g.   %s\n\ncommands:\n", root.Short, root.Example)
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			fmt.Fprintf(w, "  %-14s %s\n", c.Name(), c.Short)
		}
	}
	fmt.Fprintf(w, "\nflags:\n%s", root.Flags().FlagUsagesWrapped(0))
	fmt.Fprintln(w, "\nspotagent COMMAND --help prints a command's flags.")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// completeWords completes a flag's value from a fixed list, which
// suggestFlag also reads.
func completeWords(cmd *cobra.Command, flag string, words ...string) {
	if err := cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp)); err != nil {
		panic(err) // a flag name misspelt in this package
	}
	if err := cmd.Flags().SetAnnotation(flag, wordsKey, words); err != nil {
		panic(err)
	}
}

// wordsKey annotates a flag with the values completeWords offers.
const wordsKey = "spotagent_words"

// suggestFlag is every command's flag error: cobra suggests commands,
// not flags. An unknown --NAME that is one of a flag's values suggests
// that flag (--html: --format html); else the flag nearest in spelling,
// within a third of its length in edits (--stor: --store).
func suggestFlag(cmd *cobra.Command, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return err
	}
	best, bestD := "", len(name)/3+1
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		if slices.Contains(f.Annotations[wordsKey], name) {
			best, bestD = f.Name+" "+name, -1
		}
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return err
	}
	return fmt.Errorf("%w (did you mean --%s?)", err, best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev = cur
	}
	return prev[len(b)]
}
