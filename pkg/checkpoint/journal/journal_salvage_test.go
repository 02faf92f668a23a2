package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
)

func TestSalvageJournal(t *testing.T) {
	b, err := json.Marshal(adviceJournal(time.Hour, true, false))
	if err != nil {
		t.Fatal(err)
	}
	if j, damage := Salvage(b); damage != nil || len(j.Sessions) != 3 {
		t.Fatalf("intact journal: damage %v, %d sessions", damage, len(j.Sessions))
	}
	// A garbled field: that session has no end, the rest stands.
	garbled := strings.Replace(string(b), `"end":"2025-03-01T01:00:00Z"`, `"end":"01:00 yesterday"`, 1)
	if garbled == string(b) {
		t.Fatal("test journal lacks the first session's end")
	}
	j, damage := Salvage([]byte(garbled))
	if len(j.Sessions) != 3 || j.Sessions[0].End != nil || j.Sessions[1].End == nil || len(j.Interruptions) != 2 {
		t.Fatalf("garbled: %d sessions, %d interruptions, first end %v", len(j.Sessions), len(j.Interruptions), j.Sessions[0].End)
	}
	if len(damage) != 1 || !strings.Contains(damage[0], "sessions[0].end unreadable") {
		t.Fatalf("garbled: damage %q", damage)
	}
	// Truncated inside the interruptions: the sessions survive, and the
	// damage says where the journal stops.
	cut := strings.Index(string(b), `"interruptions"`) + 60
	j, damage = Salvage(b[:cut])
	if len(j.Sessions) != 3 || len(j.Interruptions) != 0 {
		t.Fatalf("truncated: %d sessions, %d interruptions", len(j.Sessions), len(j.Interruptions))
	}
	if len(damage) != 1 || !strings.Contains(damage[0], "interruptions[0]") || !strings.Contains(damage[0], "unexpected EOF") {
		t.Fatalf("truncated: damage %q", damage)
	}
	if _, err := Account(j, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Not JSON at all: nothing, and that is said.
	j, damage = Salvage([]byte("garbage"))
	if len(j.Sessions) != 0 || len(damage) != 1 || !strings.Contains(damage[0], "byte 0") {
		t.Fatalf("garbage: %+v, %q", j, damage)
	}
}

// adviceJournal (a copy of pkg/simulate's) is a run of three sessions of h hours each, ended by two
// notices (committed or not per ok), with δ = 20 s per checkpoint.
func adviceJournal(h time.Duration, ok ...bool) *Journal {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	j := &Journal{RunID: "r"}
	at := t0
	for i := 0; i <= len(ok); i++ {
		end := at.Add(h)
		blocked := 20.0 * 10
		j.Sessions = append(j.Sessions, Session{Start: at, End: &end, BlockedSeconds: &blocked})
		if i > 0 {
			j.Restores = append(j.Restores, RestoreEntry{At: at.Add(time.Second), Seconds: 30})
		}
		if i < len(ok) {
			det := end.Add(-2 * time.Minute)
			dl, done, com := end, det.Add(20*time.Second), det.Add(30*time.Second)
			in := Interruption{Detected: det, Deadline: &dl, CommitOK: ok[i], Bytes: 100e6}
			if ok[i] {
				in.Done, in.Committed = &done, &com
			} else {
				in.LostSeconds = 600
			}
			j.Interruptions = append(j.Interruptions, in)
		}
		at = end.Add(3 * time.Minute)
	}
	j.Stats = Stats{Checkpoints: 30, CostSeconds: 20, BytesPerSec: 10e6, LastBytes: 100e6,
		RunSeconds: 3 * h.Seconds()}
	return j
}

// ReadSalvage reads through the store like every small object
// (ReadSmall): a missing journal wraps cloud.ErrNotExist, one over the
// limit is refused, a damaged one is salvaged.
func TestReadJournalSalvage(t *testing.T) {
	ctx := t.Context()
	st := cptest.NewStore(t)
	put := func(b []byte) {
		t.Helper()
		if err := st.Put(ctx, checkpoint.JournalKey, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("ErrNotExist", func(t *testing.T) {
		if _, _, err := ReadSalvage(ctx, st); !errors.Is(err, cloud.ErrNotExist) {
			t.Fatalf("err=%v, want cloud.ErrNotExist", err)
		}
	})
	t.Run("Damaged", func(t *testing.T) {
		b, err := json.Marshal(adviceJournal(time.Hour, true, false))
		if err != nil {
			t.Fatal(err)
		}
		put(b[:len(b)-10])
		j, damage, err := ReadSalvage(ctx, st)
		if err != nil || len(damage) == 0 || len(j.Sessions) != 3 {
			t.Fatalf("err=%v, damage %q, %d sessions", err, damage, len(j.Sessions))
		}
	})
	t.Run("TooLarge", func(t *testing.T) {
		put(bytes.Repeat([]byte(" "), maxJournal+1))
		if _, _, err := ReadSalvage(ctx, st); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("err=%v, want larger than %d bytes", err, maxJournal)
		}
	})
}

// A session without a start or an interruption without a detection time
// cannot be placed: it is dropped and named, the others stay.
func TestSalvageJournal_Unplaced(t *testing.T) {
	b, err := json.Marshal(adviceJournal(time.Hour, true, false))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), `"start":"2025-03-01T01:03:00Z"`, `"start":"later"`, 1)
	s = strings.Replace(s, `"detected":"2025-03-01T00:58:00Z"`, `"detected":"soon"`, 1)
	if strings.Count(s, `"later"`)+strings.Count(s, `"soon"`) != 2 {
		t.Fatalf("test journal lacks the second session's start or the first detection:\n%s", b)
	}
	j, damage := Salvage([]byte(s))
	if len(j.Sessions) != 2 || len(j.Interruptions) != 1 || !j.Interruptions[0].Detected.Equal(time.Date(2025, 3, 1, 2, 1, 0, 0, time.UTC)) {
		t.Fatalf("%d sessions, %d interruptions %+v; want 2 and 1 (the second)", len(j.Sessions), len(j.Interruptions), j.Interruptions)
	}
	for _, w := range []string{"sessions[1] has no start: not counted", "interruptions[0] has no detected time: not counted"} {
		if !slices.Contains(damage, w) {
			t.Errorf("damage %q lacks %q", damage, w)
		}
	}
}
