package poll

import (
	"go.uber.org/zap"
)

// FaultLog logs the failures of one metadata endpoint without flooding the
// log: the first failure, then the 2nd, 4th, 8th, ... in a row, and the
// recovery. Not safe for concurrent use: keep one per loop.
type FaultLog struct {
	log    *zap.Logger
	what   string
	fails  int
	nextAt int
}

// NewFaultLog returns a FaultLog that logs as "<what> failed" / "<what> recovered".
func NewFaultLog(log *zap.Logger, what string) *FaultLog {
	if log == nil {
		log = zap.NewNop()
	}
	return &FaultLog{log: log, what: what}
}

// Fail records one failure and logs it when the count reaches a power of two.
func (f *FaultLog) Fail(err error, fields ...zap.Field) {
	f.fails++
	if f.fails < f.nextAt {
		return
	}
	f.nextAt = f.fails * 2
	f.log.Warn(f.what+" failed", append(fields, zap.Error(err), zap.Int("failures_in_a_row", f.fails))...)
}

// OK records a success and logs the recovery after failures.
func (f *FaultLog) OK() {
	if f.fails == 0 {
		return
	}
	f.log.Info(f.what+" recovered", zap.Int("failures_in_a_row", f.fails))
	f.fails, f.nextAt = 0, 0
}
