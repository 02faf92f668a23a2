package trainers

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/spotagent/spotagent/pkg/protocol"
)

func ip(v int) *int { return &v }

func TestDeclaredRanks(t *testing.T) {
	ranked := func(rank, world int) protocol.Message {
		return protocol.Message{Type: protocol.TypeHello, Rank: ip(rank), WorldSize: ip(world)}
	}
	onNode := func(rank, world, local, node int) protocol.Message {
		m := ranked(rank, world)
		m.LocalWorldSize, m.NodeRank = ip(local), ip(node)
		return m
	}
	none := protocol.Message{Type: protocol.TypeHello}
	for _, tc := range []struct {
		name   string
		hellos []protocol.Message // in order of precedence
		want   []uint64           // ids (1-based positions) waited for
		why    map[uint64]string  // a word of why each other one is left out
	}{
		{"OneTrainerNoRank", []protocol.Message{none}, []uint64{1}, nil},
		{"SecondWithoutRank", []protocol.Message{none, none}, []uint64{1}, map[uint64]string{2: "single-process"}},
		{"RankedJob", []protocol.Message{ranked(0, 2), ranked(1, 2)}, []uint64{1, 2}, nil},
		{"NoRankInRankedJob", []protocol.Message{ranked(0, 2), none, ranked(1, 2)}, []uint64{1, 3}, map[uint64]string{2: "no rank"}},
		{"DuplicateRank", []protocol.Message{ranked(0, 2), ranked(0, 2), ranked(1, 2)}, []uint64{1, 3}, map[uint64]string{2: "held by an earlier"}},
		{"BeyondWorld", []protocol.Message{ranked(0, 2), ranked(5, 8)}, []uint64{1}, map[uint64]string{2: "beyond the job's world_size 2"}},
		{"OtherWorld", []protocol.Message{ranked(0, 2), ranked(1, 4)}, []uint64{1}, map[uint64]string{2: "world_size 4"}},
		{"RankedAfterSingle", []protocol.Message{none, ranked(0, 1)}, []uint64{1}, map[uint64]string{2: "single-process"}},
		{"OtherNode", []protocol.Message{onNode(0, 4, 2, 0), onNode(2, 4, 2, 1)}, []uint64{1}, map[uint64]string{2: "node_rank 1"}},
		{"MoreThanTheNodeDeclared", []protocol.Message{onNode(0, 4, 2, 0), onNode(1, 4, 2, 0), onNode(3, 4, 2, 0)}, []uint64{1, 2},
			map[uint64]string{3: "local_world_size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conns []helloConn
			for i, h := range tc.hellos {
				conns = append(conns, helloConn{id: uint64(i + 1), hello: h})
			}
			got, _, out := declaredRanks(conns)
			if len(got) != len(tc.want) {
				t.Fatalf("waited for %v, want %v (left out %v)", got, tc.want, out)
			}
			for _, id := range tc.want {
				if !got[id] {
					t.Fatalf("waited for %v, want %v (left out %v)", got, tc.want, out)
				}
			}
			for id, word := range tc.why {
				if !strings.Contains(out[id], word) {
					t.Errorf("conn %d left out because %q, want it to say %q", id, out[id], word)
				}
			}
			if len(out)+len(got) != len(conns) {
				t.Fatalf("%d waited for and %d left out of %d", len(got), len(out), len(conns))
			}
		})
	}
}

func TestInGroup(t *testing.T) {
	if !inGroup(os.Getpid(), syscall.Getpgrp()) {
		t.Fatal("this process is not in its own process group")
	}
	if inGroup(os.Getpid(), syscall.Getpgrp()+1) || inGroup(0, syscall.Getpgrp()) {
		t.Fatal("in a group it is not in")
	}
}
