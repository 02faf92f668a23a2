package supervisor

import (
	"github.com/spotagent/spotagent/pkg/supervisor/internal/config"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

// Config wires one agent: a run, its store, its trainer
// (pkg/supervisor/internal/config).
type Config = config.Config

// Metrics receives the agent's measurements (pkg/supervisor/internal/config).
type Metrics = config.Metrics

// WatchConfig is zero-code mode's configuration (Config.Watch), named
// here too so that Config's users need not import pkg/supervisor/source.
type WatchConfig = source.WatchConfig
