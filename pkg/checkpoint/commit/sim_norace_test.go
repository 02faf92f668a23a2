//go:build !race

package checkpoint

// simDefault is TestSim's number of schedules.
const simDefault = 100_000
