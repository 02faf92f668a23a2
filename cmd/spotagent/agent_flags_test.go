package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestResolve_Signal: run's --signal is the signal the agent's fallback
// sends (Config.Signal, run.go; the fallback itself: pkg/supervisor
// TestAgent_SignalFallback), spelled with SIG or without; a signal the
// fallback does not offer is refused, naming the flag.
func TestResolve_Signal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want syscall.Signal
	}{{"SIGUSR1", syscall.SIGUSR1}, {"USR1", syscall.SIGUSR1}, {"usr2", syscall.SIGUSR2}, {"HUP", 0}} {
		var o agentOptions
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.register(fs, false)
		if err := fs.Parse([]string{"--store", t.TempDir(), "--cloud", "none"}); err != nil {
			t.Fatal(err)
		}
		o.signal = tc.in
		err := o.resolve(false)
		if tc.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "--signal") {
				t.Errorf("--signal %s: %v, want a refusal naming --signal", tc.in, err)
			}
			continue
		}
		if err != nil || o.sig != tc.want {
			t.Errorf("--signal %s: %v, %v; want %v", tc.in, o.sig, err, tc.want)
		}
	}
}

// TestResolve_CheckpointDirDefault: without --checkpoint-dir the
// checkpoint directory is the default cache ($XDG_CACHE_HOME/spotagent/
// RUN-ID), marked as such (run.go: Config.DefaultCheckpointDir, whose
// finished run's copies are deleted: pkg/supervisor
// TestAgent_FinishedRunRecordedSaidAndCacheCleared); a --checkpoint-dir
// the user named is not (the end-to-end
// TestFinishedRun_RecordedSaidAndCacheCleared was cut in #49).
func TestResolve_CheckpointDirDefault(t *testing.T) {
	cache, named := t.TempDir(), t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	for _, tc := range []struct {
		args []string
		dir  string
		def  bool
	}{
		{nil, filepath.Join(cache, "spotagent", "fin"), true},
		{[]string{"--checkpoint-dir", named}, named, false},
	} {
		var o agentOptions
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.register(fs, false)
		if err := fs.Parse(append([]string{"--store", t.TempDir(), "--cloud", "none", "--run-id", "fin"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := o.resolve(false); err != nil || o.checkpointDir != tc.dir || o.checkpointDirDefault != tc.def {
			t.Errorf("%v: checkpoint dir %s (the default cache: %v), err %v; want %s (%v)", tc.args, o.checkpointDir, o.checkpointDirDefault, err, tc.dir, tc.def)
		}
	}
}

// TestPeerTierFlags: --peer-restore's flags reach the peer tier's
// configuration (the end-to-end TestDistributed_RestoreWaitsForPeer, which
// read --peer-wait 2m back from the wait's log line, was cut in #49: the
// wait itself is pkg/checkpoint/peertier's wait_test.go and the agent's
// simulation's).
func TestPeerTierFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "{Enabled:false Listen: Advertise:[] Stall:0s PeerWait:0s Replicas:0}"},
		{[]string{"--peer-restore", "--peer-wait", "2m", "--peer-advertise", "10.0.0.1, 10.0.0.2", "--replicas", "1", "--peer-listen", ":7000"},
			"{Enabled:true Listen::7000 Advertise:[10.0.0.1 10.0.0.2] Stall:0s PeerWait:2m0s Replicas:1}"},
		{[]string{"--peer-restore", "--peer-wait", "0s"}, "PeerWait:-1ns"}, // none: the config's 0 is the default
	} {
		var o agentOptions
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.register(fs, false)
		if err := fs.Parse(append([]string{"--node-rank", "1"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		p := o.peerTier()
		got := fmt.Sprintf("{Enabled:%v Listen:%s Advertise:%v Stall:%s PeerWait:%s Replicas:%d}", p.Enabled, p.Listen, p.Advertise, p.Stall, p.PeerWait, p.Replicas)
		if !strings.Contains(got, c.want) {
			t.Errorf("%v: %s, want %s", c.args, got, c.want)
		}
	}
}

// TestCheckpointBase: the default checkpoint directory is in the user's
// cache; without a home directory (none set, or a service user's
// HOME=/nonexistent) it is in the temporary directory, of this uid alone,
// and no home is created (was: root made /nonexistent, and anyone else
// failed with 'mkdir /nonexistent: permission denied').
func TestCheckpointBase(t *testing.T) {
	home, tmp := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("XDG_CACHE_HOME", "")
	inTmp := filepath.Join(tmp, fmt.Sprintf("spotagent-cache-%d", os.Geteuid()))
	for _, c := range []struct {
		home, xdg, want string
		noHome          bool
	}{
		{home, "", filepath.Join(home, ".cache", "spotagent"), false},
		{home, "/x/cache", "/x/cache/spotagent", false},
		{filepath.Join(home, "nonexistent"), "", inTmp, true},
		{"", "", inTmp, true},
		// nobody's (RHEL) or a DynamicUser= service's: not made into a cache.
		{"/", "", map[bool]string{true: "/.cache/spotagent", false: inTmp}[isDir("/.cache")], !isDir("/.cache")},
	} {
		t.Setenv("HOME", c.home)
		t.Setenv("XDG_CACHE_HOME", c.xdg)
		var o agentOptions
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.register(fs, false)
		if err := fs.Parse([]string{"--store", "file://" + t.TempDir(), "--run-id", "r1"}); err != nil {
			t.Fatal(err)
		}
		if err := o.resolve(false); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(c.want, o.runID); o.checkpointDir != want || (o.checkpointDirNoHome != "") != c.noHome {
			t.Errorf("HOME=%q XDG_CACHE_HOME=%q: checkpoint dir %s (no home: %q), want %s (no home: %v)", c.home, c.xdg, o.checkpointDir, o.checkpointDirNoHome, want, c.noHome)
		}
	}
	if _, err := os.Stat(filepath.Join(home, "nonexistent")); !os.IsNotExist(err) {
		t.Fatalf("a home directory was created: %v", err)
	}
}

// TestPrivateBase: the default checkpoint directories' base in the
// temporary directory is made 0700, and one made first by someone else,
// open to others, or a link, is refused (another user could swap the
// run's area inside it); a run is then refused before its trainer starts.
func TestPrivateBase(t *testing.T) {
	needRoot(t)
	tmp := t.TempDir()
	if err := os.Chmod(tmp, os.ModeSticky|0o777); err != nil { // like /tmp
		t.Fatal(err)
	}
	mine := filepath.Join(tmp, "mine")
	for range 2 { // made, then found
		if err := privateBase(mine); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(mine); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("base %v (%v), want a 0700 directory", fi, err)
	}
	open := filepath.Join(tmp, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	hers := filepath.Join(tmp, "hers")
	herDir(t, hers, 0o700)
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(mine, link); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{open, hers, link} {
		if err := privateBase(d); err == nil || !strings.Contains(err.Error(), "not a private directory") {
			t.Errorf("%s: %v, want it refused", d, err)
		}
	}
	// HOME=/nonexistent, and mallory made the base first.
	t.Setenv("HOME", "/nonexistent")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("TMPDIR", tmp)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	herDir(t, filepath.Join(tmp, fmt.Sprintf("spotagent-cache-%d", os.Geteuid())), 0o777)
	ran := filepath.Join(tmp, "trainer-ran")
	code, _, errOut := cli(t, "run", "--store", "file://"+filepath.Join(t.TempDir(), "store"), "--cloud", "none", "--", "touch", ran)
	if code == 0 || !strings.Contains(errOut, "not a private directory") {
		t.Fatalf("run with another user's base: exit %d, want it refused:\n%s", code, errOut)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatalf("the trainer was started: %v", err)
	}
}
