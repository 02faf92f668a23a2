//go:build race

package agentsim

// simSchedules is TestAgentSim's number of schedules. Under the race
// detector (make test-go) a sample: it runs about ten times slower.
const simSchedules = 200
