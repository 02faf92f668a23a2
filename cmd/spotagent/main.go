// Command spotagent keeps ML training on spot machines from losing work.
// This package only parses flags and wires the packages together.
package main

import (
	"fmt"
	"os"
	"sort"

	"github.com/spotagent/spotagent/pkg/supervisor"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	run   func(args []string) int
	usage string
}

var commands = map[string]command{
	"version":       {cmdVersion, "print the version"},
	"watch":         {cmdWatch, "print interruption notices as JSON lines"},
	"fake-metadata": {cmdFakeMetadata, "serve a fake cloud metadata service for demos and tests"},
	"simulate":      {cmdSimulate, "compare checkpoint interval policies on an interruption trace"},
}

func main() {
	supervisor.RunGuardIfAsked() // a guard of a trainer's process group (run); never returns
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		return
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "spotagent: unknown command %q\n", name)
		usage()
		os.Exit(2)
	}
	os.Exit(c.run(os.Args[2:]))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: spotagent COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", n, commands[n].usage)
	}
}

func cmdVersion(args []string) int {
	fmt.Println("spotagent", version)
	return 0
}
