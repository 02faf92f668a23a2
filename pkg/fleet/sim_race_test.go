//go:build race

package fleet

// fleetSimDefault is TestFleetSim's number of schedules. Under the race
// detector each schedule is several times slower: fewer.
const fleetSimDefault = 1_000
