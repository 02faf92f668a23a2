package main

import (
	"bufio"
	"encoding/json"
	"io"
	"time"
)

// logLine is one line a benchmarked process printed, when it was read, and
// its JSON fields (nil when the line is not JSON).
type logLine struct {
	text string
	at   time.Time
	raw  map[string]any
}

// msg is the line's zap message ("" when it has none).
func (l logLine) msg() string { s, _ := l.raw["msg"].(string); return s }

// readLines copies r's lines to log and delivers them, timestamped as they
// are read, until r ends; then it closes the channel.
func readLines(r io.Reader, log io.Writer, buf int) <-chan logLine {
	lines := make(chan logLine, buf)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			at := time.Now()
			log.Write(append(sc.Bytes(), '\n'))
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m)
			lines <- logLine{sc.Text(), at, m}
		}
	}()
	return lines
}
