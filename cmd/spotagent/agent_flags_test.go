package main

import (
	"strings"
	"testing"
	"time"
)

// run, sidecar, node and report read --interval with one function.
func TestParseInterval(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{{"auto", 0}, {"15m", 15 * time.Minute}, {"90s", 90 * time.Second}} {
		if got, err := parseInterval(c.in); err != nil || got != c.want {
			t.Errorf("parseInterval(%q)=%v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "0s", "-5m", "15", "Auto", "fixed:15m"} {
		if _, err := parseInterval(in); err == nil || !strings.Contains(err.Error(), "--interval: want auto or a positive duration") {
			t.Errorf("parseInterval(%q): err=%v, want refused", in, err)
		}
	}
	o := agentOptions{interval: "bad"}
	if _, err := o.scheduler(nil); err == nil {
		t.Fatal("scheduler: --interval bad accepted")
	}
}
