package supervisor

import (
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestStopSequence_Signalled: a signal within the window of the first is
// the same one; after it, or without a window, the second counts.
func TestStopSequence_Signalled(t *testing.T) {
	var q stopSequence
	t0 := time.Now()
	if n := q.signalled(t0, time.Second); n != 1 {
		t.Fatalf("first signal: %d, want 1", n)
	}
	if n := q.signalled(t0.Add(500*time.Millisecond), time.Second); n != 0 {
		t.Fatalf("within the window: %d, want 0 (the same signal)", n)
	}
	if n := q.signalled(t0.Add(time.Second), time.Second); n != 2 {
		t.Fatalf("after the window: %d, want 2", n)
	}
	if q.firstSignal != t0 {
		t.Fatalf("first signal at %v, want %v", q.firstSignal, t0)
	}
	var off stopSequence
	off.signalled(t0, 0)
	if n := off.signalled(t0, 0); n != 2 {
		t.Fatalf("no window: %d, want 2", n)
	}
}

// TestStopSequence_TightenAndWithdraw: a notice can only bring the
// deadline forward; a withdrawn notice ends its stop only before the
// trainers were told, and its checkpoint becomes a periodic one.
func TestStopSequence_TightenAndWithdraw(t *testing.T) {
	var q stopSequence
	now := time.Now()
	if q.tighten(now) || q.withdraw("n1") {
		t.Fatal("no stop: tightened or withdrawn")
	}
	n := metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(2 * time.Minute)}
	s := newStop(n, protocol.ReasonInterruption, n.Deadline, metadata.Identity{InstanceID: "i-1"})
	if s.record.Deadline == nil || !s.record.Deadline.Equal(n.Deadline) || s.record.InstanceID != "i-1" || s.record.NoticeID != "n1" {
		t.Fatalf("record %+v, want the notice's deadline, id and machine", s.record)
	}
	q.begin(s)
	r := &request{id: "r1", stop: s}
	s.req = r
	if q.tighten(now.Add(3*time.Minute)) || !s.deadline.Equal(n.Deadline) {
		t.Fatal("a later deadline moved the stop's")
	}
	if !q.tighten(now.Add(time.Minute)) || !s.deadline.Equal(now.Add(time.Minute)) {
		t.Fatal("an earlier deadline did not move the stop's")
	}
	if q.withdraw("other") || q.current != s {
		t.Fatal("another notice's withdrawal ended the stop")
	}
	if !q.withdraw("n1") || q.current != nil || r.stop != nil {
		t.Fatal("withdrawn before the trainers were told: the stop goes on")
	}
	q.begin(s)
	s.stopSent = true
	if q.withdraw("n1") || q.current != s {
		t.Fatal("withdrawn after the trainers were told to stop: the stop ended")
	}
}

func TestStopSequence_Noticed(t *testing.T) {
	var q stopSequence
	q.noticed(metadata.Notice{ID: "a"})
	q.noticed(metadata.Notice{ID: "b"})
	if q.noticesSeen != 2 || q.lastNotice == nil || q.lastNotice.ID != "b" {
		t.Fatalf("seen %d, last %+v: want 2, b", q.noticesSeen, q.lastNotice)
	}
}

// TestStopState_ToldBySource: what a checkpoint source learns of a stop
// goes into its journal record through the stop's own methods.
func TestStopState_ToldBySource(t *testing.T) {
	s := newStop(metadata.Notice{ID: "n"}, protocol.ReasonInterruption, time.Now().Add(time.Minute), metadata.Identity{})
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	s.Asked(at)
	if s.record.Requested == nil || !s.record.Requested.Equal(at) || s.record.Requested.Location() != time.UTC {
		t.Fatalf("requested %v, want %v in UTC", s.record.Requested, at)
	}
	s.Checkpointed("c1", 40, 12.5, time.Time{})
	if s.record.CheckpointID != "c1" || s.record.Step != 40 || s.record.LostSeconds != 12.5 || s.record.Done != nil {
		t.Fatalf("record %+v, want c1 at 40, 12.5 s lost, no done", s.record)
	}
	s.Checkpointed("c2", 50, 1, at)
	if s.record.Done == nil || !s.record.Done.Equal(at) {
		t.Fatalf("done %v, want %v", s.record.Done, at)
	}
}

// TestRecordInterruption_CountedOnceInEitherOrder: a stop's record
// (step 110) and its amendment by a newer checkpoint (120) are written
// asynchronously; in either order, or with only one of them landing, the
// journal holds one committed record, of the newest step that landed, and
// counts one notice commit.
func TestRecordInterruption_CountedOnceInEitherOrder(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	first := journal.Interruption{Kind: "termination", NoticeID: "e1", Detected: at, CheckpointID: "c110", Step: 110, CommitOK: true}
	amended := first
	amended.CheckpointID, amended.Step = "c120", 120
	for _, writes := range [][]journal.Interruption{{first, amended}, {amended, first}, {amended}, {first}} {
		var j journal.Journal
		for _, rec := range writes {
			recordInterruption(rec)(&j)
		}
		want := writes[0].Step
		for _, rec := range writes {
			want = max(want, rec.Step)
		}
		if len(j.Interruptions) != 1 || j.Interruptions[0].Step != want || j.Stats.NoticeCommits != 1 {
			t.Errorf("writes of steps %v: records %+v, notice commits %d; want one of step %d, counted once",
				[]int64{writes[0].Step, writes[len(writes)-1].Step}, j.Interruptions, j.Stats.NoticeCommits, want)
		}
	}
}
