package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag of every command shows in that command's --help (#41 item 3:
// simulate's --rate, --runs and --seed were filed under a group the help
// did not print).
func TestCLI_HelpShowsEveryFlag(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.HasParent() {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		code, out, errOut := cli(t, append(path, "--help")...)
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", c.CommandPath(), code, errOut)
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			n++
			if !regexp.MustCompile(`(?m)(^|[\s,])--` + regexp.QuoteMeta(f.Name) + `(\s|$)`).MatchString(out) {
				t.Errorf("%s --help does not show --%s:\n%s", c.CommandPath(), f.Name, out)
			}
		})
	}
	walk(newRoot(nil, nil))
	if n < 50 {
		t.Fatalf("checked %d flags: the walk missed the commands", n)
	}
}
