package fleet

import (
	"bytes"
	"encoding/csv"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// The fleet says where restores read their bytes (#38 item 3): each
// restore in the cell of the machine whose session it started, its bytes
// by source, in the table's footer, the wide table, JSON and CSV. A
// restore from a journal before sources were recorded counts, with no
// bytes.
func TestFleet_RestoreSources(t *testing.T) {
	const mib = 1 << 20
	j := &journal.Journal{Format: journal.Format, RunID: "train-a"}
	j.Sessions = []journal.Session{
		{ID: "s1", Start: at(0), End: tp(time.Hour), Instance: p4dA, BlockedSeconds: fp(0)},
		{ID: "s2", Start: at(2 * time.Hour), End: tp(3 * time.Hour), Instance: p4dB, BlockedSeconds: fp(0)},
	}
	j.Restores = []journal.RestoreEntry{
		{At: at(time.Minute), Step: 10, Bytes: 3 * mib, From: map[string]int64{"store": 3 * mib}},
		{At: at(2*time.Hour + time.Minute), Step: 20, Bytes: 3 * mib, From: map[string]int64{"local": 2 * mib, "peer": mib}},
		{At: at(2*time.Hour + 2*time.Minute), Step: 20, Bytes: 3 * mib}, // an older agent's entry
	}
	r, err := RunOf(j, "train-a", 0, at(4*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Build(&Summary{Runs: map[string]*Run{"train-a": r}}, Options{Now: at(4 * time.Hour)}, "recount", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := cellOf(t, rep, p4dA.Cloud, p4dA.InstanceType, p4dA.Zone)
	if got, want := a.RestoredBytes, map[string]int64{"store": 3 * mib}; a.Restores != 1 || !maps.Equal(got, want) {
		t.Errorf("us-east-1a: %d restores from %v, want 1 from %v", a.Restores, got, want)
	}
	b := cellOf(t, rep, p4dB.Cloud, p4dB.InstanceType, p4dB.Zone)
	if got, want := b.RestoredBytes, map[string]int64{"local": 2 * mib, "peer": mib}; b.Restores != 2 || !maps.Equal(got, want) {
		t.Errorf("us-east-1b: %d restores from %v, want 2 from %v", b.Restores, got, want)
	}
	if got, want := rep.Total.RestoredBytes, map[string]int64{"local": 2 * mib, "peer": mib, "store": 3 * mib}; rep.Total.Restores != 3 || !maps.Equal(got, want) {
		t.Errorf("fleet: %d restores from %v, want 3 from %v", rep.Total.Restores, got, want)
	}

	var out bytes.Buffer
	if err := Write(&out, rep, "table"); err != nil {
		t.Fatal(err)
	}
	if want := "3 restore(s), read from local 2.0 MiB, peer 1.0 MiB, store 3.0 MiB\n"; !strings.Contains(out.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	if err := Write(&out, rep, "wide"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "RESTORED FROM") || !strings.Contains(out.String(), "local 2.0 MiB peer 1.0 MiB") {
		t.Errorf("wide table lacks the sources:\n%s", out.String())
	}
	out.Reset()
	if err := Write(&out, rep, "csv"); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	last := rows[len(rows)-1]
	for col, want := range map[string]string{"restores": "3", "restored_local_bytes": "2097152", "restored_peer_bytes": "1048576", "restored_store_bytes": "3145728"} {
		if got := last[slices.Index(csvHead, col)]; got != want {
			t.Errorf("csv fleet %s=%q, want %q", col, got, want)
		}
	}
}
