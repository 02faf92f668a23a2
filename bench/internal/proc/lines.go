package proc

import (
	"bufio"
	"encoding/json"
	"io"
	"time"
)

// LogLine is one line a benchmarked process printed, when it was read, and
// its JSON fields (nil when the line is not JSON).
type LogLine struct {
	Text string
	At   time.Time
	Raw  map[string]any
}

// Msg is the line's zap message ("" when it has none).
func (l LogLine) Msg() string { s, _ := l.Raw["msg"].(string); return s }

// ReadLines copies r's lines to log and delivers them, timestamped as they
// are read, until r ends; then it closes the channel.
func ReadLines(r io.Reader, log io.Writer, buf int) <-chan LogLine {
	lines := make(chan LogLine, buf)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			at := time.Now()
			log.Write(append(sc.Bytes(), '\n'))
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m)
			lines <- LogLine{sc.Text(), at, m}
		}
	}()
	return lines
}
