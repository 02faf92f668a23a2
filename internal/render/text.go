// Package render is what spotagent's commands print: status, report,
// history and list as tables or JSON. It decides nothing: each function
// writes what it is given.
package render

import (
	"fmt"
	"time"
)

// Seconds converts a journal's or the advice's float Seconds.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Upper is s in capitals (ASCII).
func Upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 32
		}
	}
	return string(b)
}

// OrDash is s, or "-" when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Plural is "1 session", "2 sessions".
func Plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// localTime is t as local date and time.
func localTime(t time.Time) string { return t.Local().Format(time.DateTime) }

// age rounds d for reading: seconds under an hour, minutes above.
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}
