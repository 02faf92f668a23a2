package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// newFlagSet returns a FlagSet for one command. Parse it with parseFlags;
// on an error return flagExit(err).
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("spotagent "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: spotagent %s [flags]\n\nflags:\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags applies the environment fallbacks, then parses args: every
// flag takes its default from SPOTAGENT_<FLAG> (upper case, dashes as
// underscores) when that is set. Asked for with -h or --help, the usage
// goes to stdout (unless the FlagSet has its own output) and the error is
// flag.ErrHelp; a bad flag prints the error and usage to stderr.
func parseFlags(fs *flag.FlagSet, args []string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
				return
			}
			f.DefValue = v
		}
		f.Usage += " (env " + env + ")"
	})
	if err != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return err
	}
	out := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err = fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) && out == os.Stderr {
		out = os.Stdout
	}
	out.Write(buf.Bytes())
	return err
}

// flagExit is the exit code for an error from parseFlags: 0 when help was
// asked for, 2 (bad usage) otherwise.
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func envName(flagName string) string {
	return "SPOTAGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
