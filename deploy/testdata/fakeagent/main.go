// Command fakeagent stands in for cmd/spotagent in the release test: it
// builds in a second, and answers `version` the way spotagent does, from the
// same -X main.version variable.
package main

import (
	"fmt"
	"os"
)

var version = "dev"

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println("spotagent", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: fakeagent version")
	os.Exit(2)
}
