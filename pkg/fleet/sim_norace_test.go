//go:build !race

package fleet

// fleetSimDefault is TestFleetSim's number of schedules.
const fleetSimDefault = 4_000
