package protocol

import (
	"encoding/json"
	"testing"
	"time"
)

// wireAll is a Message with every field set, as the wire has carried it
// since before Topology and Saved were split out of Message (#35): their
// fields stay on the top level, in the same order.
const wireAll = `{"type":"done","pid":7,"rank":1,"world_size":2,"run_id":"r","local_rank":3,"local_world_size":4,"node_rank":5,"nodes":6,"step":8,"id":"c","metadata":{"a":1},"blocked_ms":9,"path":"p","error":"e","version":2,"checkpoint_dir":"/d","resume":{"dir":"","step":0,"id":"","manifest":""},"restore":"pending","reason":"periodic","dir":"/x","deadline":"2026-01-02T03:04:05Z","uri":"s3://b","status":{"s":2}}`

// TestMessage_WireFormat: every field of Message encodes to the same bytes
// as before its fields were grouped, and decodes back to the same message.
func TestMessage_WireFormat(t *testing.T) {
	i := func(n int) *int { return &n }
	i64 := func(n int64) *int64 { return &n }
	d := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := Message{Type: TypeDone, PID: 7, Rank: i(1), WorldSize: i(2), RunID: "r",
		Topology: Topology{LocalRank: i(3), LocalWorldSize: i(4), NodeRank: i(5), Nodes: i(6)},
		Step:     i64(8), ID: "c",
		Saved: Saved{Metadata: json.RawMessage(`{"a":1}`), BlockedMS: i64(9), Path: "p"},
		Error: "e", Version: 2, CheckpointDir: "/d", Resume: &Resume{}, Restore: "pending", Reason: "periodic",
		Dir: "/x", Deadline: &d, URI: "s3://b", Status: json.RawMessage(`{"s":2}`)}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), wireAll; got != want {
		t.Fatalf("encoded\n%s\nwant\n%s", got, want)
	}
	var back Message
	if err := json.Unmarshal([]byte(wireAll), &back); err != nil {
		t.Fatal(err)
	}
	if *back.Nodes != 6 || *back.BlockedMS != 9 || back.Path != "p" || string(back.Metadata) != `{"a":1}` {
		t.Fatalf("decoded %+v", back)
	}
	if b2, _ := json.Marshal(back); string(b2) != wireAll {
		t.Fatalf("round trip\n%s\nwant\n%s", b2, wireAll)
	}
}
