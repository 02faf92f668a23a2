package connlimit

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// warnEvery: a message of Warnings is logged at most once per this
// interval, with the count of those it stands for.
const warnEvery = time.Minute

// Warnings logs a warning of each message at most once per warnEvery,
// counting those it stands for: a flood must not fill the disk with logs.
type Warnings struct {
	log *zap.Logger
	mu  sync.Mutex
	by  map[string]*warning
}

type warning struct {
	logged time.Time
	count  int
}

// NewWarnings logs to log (nil: nowhere).
func NewWarnings(log *zap.Logger) *Warnings {
	if log == nil {
		log = zap.NewNop()
	}
	return &Warnings{log: log, by: map[string]*warning{}}
}

// Note counts one event of msg, and logs it with fields when its interval has passed.
func (w *Warnings) Note(msg string, fields ...zap.Field) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.by[msg]
	if e == nil {
		e = &warning{}
		w.by[msg] = e
	}
	e.count++
	now := time.Now()
	if !e.logged.IsZero() && now.Sub(e.logged) < warnEvery {
		return
	}
	w.log.Warn(msg, append(fields, zap.Int("count", e.count), zap.Duration("interval", warnEvery))...)
	e.logged, e.count = now, 0
}
