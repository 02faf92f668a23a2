package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// newFlagSet returns a FlagSet for one command. Parse it with parseFlags.
func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("spotagent "+name, flag.ContinueOnError)
}

// parseFlags applies the environment fallbacks, then parses args: every
// flag takes its default from SPOTAGENT_<FLAG> (upper case, dashes as
// underscores) when that is set.
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
		return err
	}
	return fs.Parse(args)
}

func envName(flagName string) string {
	return "SPOTAGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
