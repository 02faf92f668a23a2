package main

import "fmt"

// cmdWatch is a placeholder until its package lands.
func cmdWatch(args []string) int {
	fmt.Println("not implemented yet")
	return 2
}
