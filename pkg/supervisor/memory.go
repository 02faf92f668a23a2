package supervisor

import (
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/memtrim"
)

// releaseStartup unmaps the executable's pages that only start-up used
// (every package's init, the restore): what the agent runs from here on
// faults back in from the page cache (internal/memtrim). Called once the
// agent is ready.
func releaseStartup(log *zap.Logger) {
	rel, err := memtrim.Release()
	if err != nil {
		log.Debug("start-up pages not released", zap.Error(err))
		return
	}
	log.Debug("start-up pages released", zap.Int64("resident_bytes", rel.Resident), zap.Int64("mapped_bytes", rel.Mapped))
}
