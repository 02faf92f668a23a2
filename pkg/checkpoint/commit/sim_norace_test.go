//go:build !race

package commit

// simDefault is TestSim's number of schedules.
const simDefault = 100_000
