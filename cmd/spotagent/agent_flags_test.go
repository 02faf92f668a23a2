package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// TestResolve_Defaults: each agent command's defaults pass the checks made
// before the store is opened (node has no watch flags: their zero values
// are not "set without --watch").
func TestResolve_Defaults(t *testing.T) {
	for _, tc := range []struct {
		build func() *cobra.Command
		node  bool
		store string
	}{{newRunCmd, false, "store"}, {newSidecarCmd, false, "store"}, {newNodeCmd, true, "store-prefix"}} {
		var o agentOptions
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.register(fs, tc.node)
		if err := fs.Parse([]string{"--" + tc.store, t.TempDir(), "--cloud", "none"}); err != nil {
			t.Fatal(err)
		}
		if tc.node {
			o.concurrentCommits = 2
		}
		if err := o.resolve(tc.node); err != nil {
			t.Errorf("%s: defaults refused: %v", tc.build().Name(), err)
		}
	}
}
