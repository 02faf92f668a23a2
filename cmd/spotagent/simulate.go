package main

import "fmt"

// cmdSimulate is a placeholder until its package lands.
func cmdSimulate(args []string) int {
	fmt.Println("not implemented yet")
	return 2
}
