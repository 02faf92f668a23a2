//go:build race

package commit

// simDefault is TestSim's number of schedules. Under the race detector
// (make test-go) a sample: make test-sim runs the full count without it.
const simDefault = 1_000
