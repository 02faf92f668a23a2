package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/bench/internal/proc"
)

func TestParseRecoveryLine(t *testing.T) {
	s, ok := parseRecoveryLine("bench: first_step 100.5 rank 3 resumed 93 started 90 imported 91 pg 92.25 connected 93 restored 94 loaded 95.5\n")
	if !ok || s.Training || s.Rank != 3 || s.Resumed != 93 || s.Times["first_step"] != 100.5 || s.Times["pg"] != 92.25 || s.Times["loaded"] != 95.5 {
		t.Fatalf("first_step line: %+v, %v", s, ok)
	}
	if s, ok := parseRecoveryLine("bench: training rank 2 step 1"); !ok || !s.Training || s.Rank != 2 {
		t.Fatalf("training line: %+v, %v", s, ok)
	}
	for _, bad := range []string{
		"rank 0 step 5", // train_ddp.py's, not ours
		`{"msg":"trainer connected"}`,
		"bench: first_step x rank 3 resumed 93 started 90 imported 91 pg 92 connected 93 restored 94 loaded 95",
		"bench: first_step 1 rank 3 resumed 93 started 90 imported 91 pg 92 connected 93 loaded 94 restored 95", // names out of order
		"bench: first_step 1 rank 3 resumed 93",
		"bench: training rank two step 1",
	} {
		if s, ok := parseRecoveryLine(bad); ok {
			t.Errorf("%q parsed as %+v", bad, s)
		}
	}
}

// restoredLine is an agent's "restored checkpoint" line read at at.
func restoredLine(at time.Time, step, local, peer, store float64) proc.LogLine {
	return proc.LogLine{At: at, Raw: map[string]any{"msg": "restored checkpoint", "step": step,
		"local_bytes": local, "peer_bytes": peer, "store_bytes": store}}
}

func TestRecoveryFromBreakdown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	step := func(rank int, first, connected float64) recoveryStep {
		return recoveryStep{Rank: rank, Resumed: 93, Times: map[string]float64{"first_step": 1000 + first, "connected": 1000 + connected, "loaded": 1000 + first - 1, "started": 1000 + connected - 5, "imported": 1000 + connected - 5 + float64(rank)}}
	}
	m := recoveryMarks{Event: at(0), Detect: at(0.5), Commit: at(2), Exited: at(5), Restart: at(7),
		Steps: []recoveryStep{step(0, 20, 15), step(1, 21, 16), step(2, 22, 17), step(3, 20.5, 14)}}
	x, err := recoveryFrom(recoveryCases[0], m, []proc.LogLine{restoredLine(at(9), 93, 100, 0, 0), restoredLine(at(10), 93, 0, 60, 40)},
		2*time.Second, recoveryRun{Codes: []int{75, 75}, Load: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, got, want float64) {
		if d := got - want; d > 1e-6 || d < -1e-6 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("detect", x.Detect, 0.5)
	near("commit", x.Commit, 1.5)
	near("exit", x.Exit, 3)
	near("delay", x.Delay, 2)
	near("restore (slower node)", x.Restore, 3)
	near("boot (slowest rank)", x.Boot, 10)
	near("first resumed step (slowest rank)", x.First, 15)
	near("total", x.Total, 22)
	near("import (slowest rank)", x.Import, 3)
	if x.Local != 100 || x.Peer != 60 || x.Store != 40 || x.Bytes[1] != [3]int64{0, 60, 40} || x.Step != 93 {
		t.Errorf("bytes %d/%d/%d, node 1 %v, step %d", x.Local, x.Peer, x.Store, x.Bytes[1], x.Step)
	}

	// A lost node: no commit; the exit counts from the verdict.
	m.Commit = time.Time{}
	x, err = recoveryFrom(recoveryCases[1], m, []proc.LogLine{restoredLine(at(9), 93, 100, 0, 0), restoredLine(at(10), 93, 0, 0, 100)}, 2*time.Second, recoveryRun{})
	if err != nil {
		t.Fatal(err)
	}
	near("lost: commit", x.Commit, 0)
	near("lost: exit", x.Exit, 4.5)

	// Disagreements are errors, not numbers.
	m.Steps[2].Resumed = 80
	if _, err := recoveryFrom(recoveryCases[0], m, []proc.LogLine{restoredLine(at(9), 93, 1, 0, 0), restoredLine(at(10), 93, 1, 0, 0)}, 0, recoveryRun{}); err == nil || !strings.Contains(err.Error(), "rank 2 resumed step 80") {
		t.Errorf("a rank resuming another step: %v", err)
	}
	m.Steps[2].Resumed = 93
	if _, err := recoveryFrom(recoveryCases[0], m, []proc.LogLine{restoredLine(at(9), 93, 1, 0, 0), restoredLine(at(10), 92, 1, 0, 0)}, 0, recoveryRun{}); err == nil {
		t.Error("nodes restoring different steps: no error")
	}
	if _, err := recoveryFrom(recoveryCases[0], recoveryMarks{Steps: m.Steps[:3]}, nil, 0, recoveryRun{}); err == nil {
		t.Error("3 ranks of 4: no error")
	}
}

func TestRecoveryReportMedians(t *testing.T) {
	run := func(total, detect float64, codes ...int) recoveryRun {
		return recoveryRun{Total: total, Detect: detect, Codes: codes, Load: 2, Bytes: [2][3]int64{{128 << 20, 0, 0}, {0, 64 << 20, 64 << 20}}}
	}
	out := recoveryReport(map[string][]recoveryRun{
		"notice": {run(30, 1, 75, 75), run(10, 3, 75, 75), run(20, 2, 75, 1)},
		"lost":   {run(40, 3, 75)},
	}, 128, 2*time.Second, "/usr/bin/python3")
	for _, want := range []string{
		"| (a) spot notice on node 1, node 1 replaced | 3 | 2.000 |", // median detect
		"**20.00** (10.00–30.00)",                                    // median total, range
		"(1 × 1, 75 × 5)",                                            // exit codes counted over runs
		"| 128.0 MiB local | 64.0 MiB peer + 64.0 MiB store |",       // tiers per node
		"| (b) node 1 lost without notice (SIGKILL of its tree), node 1 replaced | 1 | 3.000 | — (the last periodic one stands) |",
		"modelled restart delay, 2s from the last agent's exit",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(c) whole-job") {
		t.Error("a case without runs has a row")
	}
}
