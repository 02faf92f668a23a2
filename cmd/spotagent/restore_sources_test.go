package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"

	"github.com/spotagent/spotagent/internal/render"
)

// TestHistory_RestoreSources: history and report say where each restore
// read its bytes (#38 item 3); a journal from before says nothing.
func TestHistory_RestoreSources(t *testing.T) {
	at := time.Date(2026, 5, 4, 11, 0, 0, 0, time.UTC)
	j := sampleJournal()
	j.Restores = []checkpoint.RestoreEntry{
		{At: at, CheckpointID: "a1", Step: 10, Bytes: 3 << 20, From: map[string]int64{"local": 3 << 20}},
		{At: at, CheckpointID: "a2", Step: 20, Bytes: 3 << 20, From: map[string]int64{"local": 2 << 20, "store": 1 << 20}},
		{At: at, CheckpointID: "a3", Step: 30, Bytes: 3 << 20}, // an older journal
	}
	var b bytes.Buffer
	render.Journal(&b, j)
	lines := strings.Split(b.String(), "\n")
	find := func(id string) string {
		for _, l := range lines {
			if strings.Contains(l, " "+id+" ") {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		t.Fatalf("no row for %s in\n%s", id, b.String())
		return ""
	}
	for id, want := range map[string]string{"a1": " local 0 B ", "a2": " local+store 1.0 MiB ", "a3": " - - "} {
		if got := find(id); !strings.Contains(got, want) {
			t.Errorf("row %q: want %q", got, want)
		}
	}
	b.Reset()
	render.RestoreSources(&b, j.Restores)
	if got, want := b.String(), "restores: 1 from local, 1 from local+store; read 5.0 MiB from local, 1.0 MiB from store\n"; got != want {
		t.Errorf("report line %q, want %q", got, want)
	}
}
