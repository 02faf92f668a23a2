package journal

import (
	"testing"
	"time"
)

// TestFinishedBefore: only the session that ended last counts, and only
// when its trainer finished; a session still running (no end) is ignored.
func TestFinishedBefore(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) *time.Time { v := t0.Add(time.Duration(m) * time.Minute); return &v }
	for _, tc := range []struct {
		name     string
		sessions []Session
		want     int // index of the session returned; -1: nil
	}{
		{"none", nil, -1},
		{"running", []Session{{Start: *at(0)}}, -1},
		{"interrupted last", []Session{{End: at(5), Finished: true}, {End: at(9)}}, -1},
		{"finished last", []Session{{End: at(5)}, {End: at(9), Finished: true, LastStep: ptr(int64(300))}}, 1},
		// Sessions of a job's nodes are appended concurrently: the order
		// in the slice is not the order they ended in.
		{"finished last, listed first", []Session{{End: at(9), Finished: true}, {End: at(5)}}, 0},
		{"a later start still running", []Session{{End: at(5), Finished: true}, {Start: *at(6)}}, 0},
	} {
		j := &Journal{Sessions: tc.sessions}
		got := j.FinishedBefore()
		switch {
		case tc.want < 0 && got != nil:
			t.Errorf("%s: got %+v, want none", tc.name, got)
		case tc.want >= 0 && got != &j.Sessions[tc.want]:
			t.Errorf("%s: got %+v, want session %d", tc.name, got, tc.want)
		}
	}
}

// TestRecordInterruption: one interruption's record, written twice in
// either order (the agent's writes land in any order), ends with its newest
// committed step and its commit is counted once; a failed record then a
// committed one (a stop's upload past its deadline) ends committed;
// another interruption is a record of its own.
func TestRecordInterruption(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	first := Interruption{Kind: "termination", NoticeID: "e1", Detected: at, CheckpointID: "a", Step: 110, CommitOK: true}
	later := first
	later.CheckpointID, later.Step = "b", 120
	failed := Interruption{Kind: "termination", NoticeID: "e1", Detected: at, CheckpointID: "b", Step: 120, Error: "deadline passed"}
	for _, order := range [][]Interruption{{first, later}, {later, first}, {failed, later}, {later, failed}} {
		var j Journal
		counted := 0
		for _, rec := range order {
			// As read back from the store: no monotonic clock, another location.
			rec.Detected = rec.Detected.In(time.FixedZone("x", 3600)).Round(0)
			if j.RecordInterruption(rec) {
				counted++
			}
		}
		if in := j.Interruptions; counted != 1 || len(in) != 1 || in[0].Step != 120 || in[0].CheckpointID != "b" || !in[0].CommitOK {
			t.Fatalf("order %+v: counted %d, records %+v, want one committed of step 120 counted once", order, counted, in)
		}
		other := first
		other.Detected = at.Add(time.Minute)
		if !j.RecordInterruption(other) || len(j.Interruptions) != 2 {
			t.Fatalf("a second interruption not recorded: %+v", j.Interruptions)
		}
	}
	var j Journal
	if j.RecordInterruption(failed) || len(j.Interruptions) != 1 {
		t.Fatalf("a failed interruption counted as a commit, or not recorded: %+v", j.Interruptions)
	}
}
