// Command arch measures the code's shape against issue 35's targets and
// prints each target beside its measured value (`make arch`). It reads the
// source with go/parser and go/ast only: no build, no type checking, a
// couple of seconds on the whole module.
//
// What it measures, precisely (docs/architecture.md, "Targets"):
//   - fields: the names a struct type declares (an embedded field is one),
//     counted for owners (a struct with an unexported field); flag and
//     config structs (a name ending in Config, Flags, flags or Options, or
//     any struct in a main package) are exempt.
//   - Agent (information): pkg/supervisor's Agent, its fields and methods.
//   - package lines (information): the lines of a package's non-test .go
//     files.
//   - run back up: within one package, a call from a function in one file
//     to a function or method declared in another, each (caller, callee)
//     pair once; calls through an imported package's name are not ours. Files are in the package's layer
//     order, the order docs/architecture.md's file map lists them, top
//     (the entry point) first; a call from a file to one listed above it
//     runs back up. A callee is found by name: a plain call names a
//     package-level function, a selector call a method declared in the
//     package under that name (skipped when methods of that name sit in
//     several files: they cannot be told apart without types).
//   - import circles: Go packages of this module (non-test imports) and
//     the Python client's modules (python/spotagent, every import).
//   - function lines: each non-test function or method declaration, first
//     line to last, outside bench/.
//   - ownership (owners.go, type-checked with golang.org/x/tools/go/packages):
//     writes into another package's owners' exported fields, interfaces
//     over 8 methods, packages without tests.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	order := flag.Bool("order", false, "print, per package, a file order in which few calls run back up (for the file map)")
	writes := flag.Bool("writes", false, "list every write into another package's exported fields, most written first")
	fileMap := flag.Bool("map", false, "print docs/architecture.md's file map table brought up to date (new files appended, gone ones dropped, imports as the source says)")
	flag.Parse()
	if *fileMap {
		if err := printMap(*root, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "arch:", err)
			os.Exit(1)
		}
		return
	}
	if *order {
		if err := suggestOrder(*root, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "arch:", err)
			os.Exit(1)
		}
		return
	}
	own, err := measureOwnership(*root) // owners.go
	if err != nil {
		fmt.Fprintln(os.Stderr, "arch:", err)
		os.Exit(1)
	}
	if *writes {
		own.printWrites(os.Stdout)
		return
	}
	r, err := measure(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "arch:", err)
		os.Exit(1)
	}
	r.print(os.Stdout)
	own.print(os.Stdout, mark)
}
