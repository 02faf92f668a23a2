package promise

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

type metrics struct{ needs []time.Duration }

func (m *metrics) NoticePromise(need time.Duration, budgets map[string]time.Duration) {
	m.needs = append(m.needs, need)
}

func TestFromJournal(t *testing.T) {
	j := &journal.Journal{Stats: journal.Stats{LastBytes: 1 << 30, BytesPerSec: 1 << 28, SaveSeconds: 5, CheckpointSeconds: 20}}
	p := FromJournal(j)
	if p.Source != "journal" || p.Lower || p.Need() != 20*time.Second || p.Upload != 4*time.Second {
		t.Fatalf("promise %+v (need %v), want the journal's 20 s, not a lower bound", p, p.Need())
	}
	j.Stats.SaveSeconds, j.Stats.CheckpointSeconds = 0, 0 // an older agent's journal
	if p := FromJournal(j); !p.Lower || p.Need() != 4*time.Second {
		t.Fatalf("no save recorded: %+v, want the upload alone as a lower bound", p)
	}
	j = &journal.Journal{Restores: []journal.RestoreEntry{{Bytes: 1 << 30, Seconds: 8}, {Bytes: 0}}}
	if p := FromJournal(j); p.Source != "restore" || !p.Lower || p.Need() != 8*time.Second {
		t.Fatalf("restore only: %+v, want the restore's 8 s as a lower bound", p)
	}
	if p := FromJournal(&journal.Journal{}); p.Known() {
		t.Fatalf("empty journal: %+v known", p)
	}
}

// TestState_SaysAVerdictOnceUntilItChanges: a misfit is warned once, a
// fit after it said once; the metric gets every prediction.
func TestState_SaysAVerdictOnceUntilItChanges(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	m := &metrics{}
	ps := NewState(Env{Identity: metadata.Identity{Cloud: metadata.CloudGCP}, Margin: 5 * time.Second, Metrics: m, Log: zap.New(core)})
	sent := time.Now()
	note := func(took time.Duration) {
		ps.Note(protocol.ReasonPeriodic, sent, false, &commit.Result{Bytes: 1 << 20, Upload: time.Second}, sent.Add(took/2), sent.Add(took), true)
	}
	note(60 * time.Second) // GCP's 30 s notice, 5 s margin: does not fit
	note(70 * time.Second)
	if got := logs.FilterLevelExact(zapcore.WarnLevel).Len(); got != 1 {
		t.Fatalf("%d warnings for two misfits in a row, want 1", got)
	}
	if st := ps.Status(); st == nil || st.Problem == "" || st.Notice != "gcp" || st.NeedSeconds != 70 {
		t.Fatalf("status %+v, want gcp's problem with the newest need", st)
	}
	note(10 * time.Second)
	note(12 * time.Second)
	if got := logs.FilterMessage("a notice checkpoint commits within the notice").Len(); got != 1 {
		t.Fatalf("%d lines for fitting again, want 1", got)
	}
	if len(m.needs) != 4 {
		t.Fatalf("metric told %d predictions, want 4", len(m.needs))
	}
	ps.Note(protocol.ReasonManual, sent, false, &commit.Result{Bytes: 1}, sent.Add(time.Hour), sent.Add(time.Hour), true)
	if len(m.needs) != 4 || ps.Estimate().Need() != 12*time.Second {
		t.Fatal("a trainer's own checkpoint changed the prediction")
	}
}

// TestDescribe_SignalOnly: a machine without a cloud's notice is judged
// against the shutdown grace, listed beside the clouds'.
func TestDescribe_SignalOnly(t *testing.T) {
	ps := NewState(Env{TermGrace: 20 * time.Second, Margin: 5 * time.Second, Metrics: &metrics{}, Log: zap.NewNop()})
	if ps.Status() != nil {
		t.Fatal("a status before anything is known")
	}
	sent := time.Now()
	ps.Note(protocol.ReasonPeriodic, sent, false, &commit.Result{Bytes: 1 << 20, Upload: time.Second}, sent.Add(5*time.Second), sent.Add(10*time.Second), true)
	st := ps.Status()
	if st == nil || st.Notice != string(metadata.CloudSignal) || st.Problem != "" {
		t.Fatalf("status %+v, want the signal's notice, fitting", st)
	}
	last := st.Clouds[len(st.Clouds)-1]
	if last.Cloud != string(metadata.CloudSignal) || last.NoticeSeconds != 20 || last.BudgetSeconds != 15 || !last.Fits {
		t.Fatalf("own notice %+v, want signal 20 s, budget 15 s, fits", last)
	}
	for _, c := range st.Clouds {
		if c.Cloud == "aws" && !c.Fits || c.Cloud == "gcp" && !c.Fits {
			t.Fatalf("10 s does not fit %s's notice: %+v", c.Cloud, c)
		}
	}
}
