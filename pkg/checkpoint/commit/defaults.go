package commit

import "go.uber.org/zap"

// What a Committer's zero fields mean.

func (c *Committer) concurrency() int {
	if c.Concurrency > 0 {
		return c.Concurrency
	}
	return 4
}

func (c *Committer) log() *zap.Logger {
	if c.Log != nil {
		return c.Log
	}
	return zap.NewNop()
}

// epoch is the epoch a committer records in its manifests (0: no lease).
func (c *Committer) epoch() int64 {
	if c.Lease == nil {
		return 0
	}
	return c.Lease.Epoch
}
