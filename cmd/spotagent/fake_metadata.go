package main

import "fmt"

// cmdFakeMetadata is a placeholder until its package lands.
func cmdFakeMetadata(args []string) int {
	fmt.Println("not implemented yet")
	return 2
}
