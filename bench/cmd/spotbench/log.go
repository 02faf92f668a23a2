package main

import (
	"fmt"
	"os"
	"time"
)

func step(s string) { fmt.Fprintf(os.Stderr, "== %s  %s\n", time.Now().Format("15:04:05"), s) }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "   "+format+"\n", args...)
}

func must(err error) {
	if err != nil {
		fatal(err)
	}
}

// atFatal is run by fatal before it exits: servers must not outlive a
// failed run (a second run's MinIO on the same data dir corrupts both).
var atFatal []func()

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "spotbench:", err)
	for _, f := range atFatal {
		f()
	}
	os.Exit(1)
}
