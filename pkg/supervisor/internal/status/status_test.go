package status

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata"
)

// keys is the top-level JSON keys of v.
func keys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestStatus_WireNames: the status reply's JSON names are what
// `spotagent status` and the clients read, an older agent's included:
// renaming one breaks them. Optional parts are left out when absent.
func TestStatus_WireNames(t *testing.T) {
	bare := Status{RunID: "r", Store: "file:///s", Started: time.Unix(0, 0)}
	want := []string{"cloud", "instance", "interval", "notices_seen", "pending", "run_id", "started", "step", "store", "trainers", "uploading"}
	if got := keys(t, bare); !slices.Equal(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	next := time.Unix(10, 0)
	full := bare
	full.Child = &ChildStatus{PID: 7, Running: true, Restarts: 1}
	full.LastCheckpoint = &CheckpointStatus{ID: "c", Step: 3}
	full.NextCheckpoint = &next
	full.LastNotice = &metadata.Notice{ID: "n"}
	full.Stopping = "interruption"
	want = append(want, "child", "last_checkpoint", "last_notice", "next_checkpoint", "stopping")
	slices.Sort(want)
	if got := keys(t, full); !slices.Equal(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	if got, want := keys(t, full.Child), []string{"pid", "restarts", "running"}; !slices.Equal(got, want) {
		t.Fatalf("child keys %v, want %v", got, want)
	}
	if got, want := keys(t, full.LastCheckpoint), []string{"at", "bytes", "id", "step"}; !slices.Equal(got, want) {
		t.Fatalf("checkpoint keys %v, want %v", got, want)
	}
}

// TestNodeStatus_ToldFromARunsStatus: a node agent's reply says node
// true, which a run's Status never has; a run still starting has no status.
func TestNodeStatus_ToldFromARunsStatus(t *testing.T) {
	ns := NodeStatus{Node: true, StorePrefix: "s3://b/p", Runs: []NodeRunStatus{{Key: "r/node-1"}, {Key: "r2", Status: &Status{RunID: "r2"}}}}
	b, err := json.Marshal(ns)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Node bool `json:"node"`
		Runs []map[string]json.RawMessage
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Node || len(back.Runs) != 2 {
		t.Fatalf("node reply %s", b)
	}
	if _, ok := back.Runs[0]["status"]; ok {
		t.Fatalf("a run still starting has a status: %s", b)
	}
	if _, ok := back.Runs[1]["status"]; !ok {
		t.Fatalf("a running run's status is missing: %s", b)
	}
	if slices.Contains(keys(t, Status{}), "node") {
		t.Fatal("a run's status says node")
	}
}
