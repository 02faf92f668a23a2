//go:build !race

package agentsim

// simSchedules is TestAgentSim's number of schedules (make test-sim;
// SPOTAGENT_SIM_SCHEDULES for more: make soak-sim).
const simSchedules = 10_000
