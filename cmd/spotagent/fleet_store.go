package main

import (
	"context"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/spotagent/spotagent/pkg/supervisor"
)

// fleetOff is the --fleet value that records nothing and reads no prior.
const fleetOff = "off"

// openFleet sets where the agent records its sessions for `spotagent
// fleet` and reads its prior (docs/fleet.md, "Where the fleet records
// live"): --fleet URI, a store every run of the fleet names; without it
// the run's own store (node: --store-prefix, shared by its runs). Nothing
// is written outside a store the user named. It returns what closes the
// store it opened.
func (o *agentOptions) openFleet(ctx context.Context, cfg *supervisor.Config, node bool, log *zap.Logger) func() {
	switch {
	case o.fleet == fleetOff:
		return func() {}
	case o.fleet == "" && !node:
		cfg.Fleet, cfg.FleetDir = cfg.Store, "" // the run is the fleet's root
		return func() {}
	}
	uri := o.fleet
	if uri == "" {
		uri = o.store // node: the runs' prefix
	}
	// Its own "store opened" line would read as a second store.
	st, err := o.storeFlags.openStore(ctx, uri, log.WithOptions(zap.IncreaseLevel(zapcore.WarnLevel)))
	if err != nil {
		log.Warn("fleet store unusable: no fleet prior, no fleet record", zap.String("fleet", uri), zap.Error(err))
		return func() {}
	}
	cfg.Fleet, cfg.FleetDir = st, fleetDir(uri, o.store, o.runID)
	return func() { st.Close() }
}

// fleetDir names a run in the fleet: its store's path under the fleet's
// (s3://b/runs/team/r1 under s3://b/runs: team/r1), else its run id.
// Node mode names each run by its id (pkg/supervisor).
func fleetDir(fleetURI, storeURI, runID string) string {
	f, s := strings.TrimRight(fleetURI, "/")+"/", strings.TrimRight(storeURI, "/")
	if rel, ok := strings.CutPrefix(s, f); ok && rel != "" {
		return rel
	}
	return runID
}
