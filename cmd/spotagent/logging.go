package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the zap logger for --log-format and --log-level. Logs go
// to stderr; the trainer's own output passes through unchanged.
func newLogger(format, level string) (*zap.Logger, error) {
	return newLoggerTo(os.Stderr, format, level)
}

// newLoggerTo is newLogger writing to w.
func newLoggerTo(w io.Writer, format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	var encoder zapcore.Encoder
	switch format {
	case "json":
		encoder = zapcore.NewJSONEncoder(enc)
	case "console", "":
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		enc.ConsoleSeparator = " "
		enc.EncodeDuration = humanDuration
		encoder = zapcore.NewConsoleEncoder(enc)
	default:
		return nil, fmt.Errorf("--log-format: want json or console, got %q", format)
	}
	core := zapcore.NewCore(encoder, zapcore.Lock(zapcore.AddSync(w)), lvl)
	// A bound on what anyone can make the agent write: a trainer (or a
	// local user on the socket) that repeats a refused message thousands
	// of times a second would otherwise fill the node's log disk. zap's
	// sampler, per message and level: the first logSampleFirst in each
	// second are written, then one in logSampleThereafter.
	core = zapcore.NewSamplerWithOptions(core, time.Second, logSampleFirst, logSampleThereafter)
	return zap.New(core).Named("spotagent"), nil
}

// The log's sampling (newLoggerTo): per message and level, per second.
const (
	logSampleFirst      = 1000
	logSampleThereafter = 1000
)

// humanDuration writes a duration with its unit ("81ms", "1m59.069s") on
// the console, where a bare 0.081321945 left the reader to guess seconds;
// JSON keeps seconds as numbers for machines.
func humanDuration(d time.Duration, e zapcore.PrimitiveArrayEncoder) {
	if d >= time.Millisecond || d <= -time.Millisecond {
		d = d.Round(time.Millisecond)
	}
	e.AppendString(d.String())
}
