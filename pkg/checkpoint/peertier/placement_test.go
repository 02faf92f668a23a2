package peertier

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
)

// job is a job checkpoint's parts on machines in zones (cloud aws) of
// instance types; "" is unknown.
func job(zones, types []string) []checkpoint.PartInfo {
	var ps []checkpoint.PartInfo
	for i := range zones {
		p := checkpoint.PartInfo{Node: fmt.Sprintf("node-%d", i)}
		if zones[i] != "" || types[i] != "" {
			p.Source = &checkpoint.Machine{Cloud: "aws", Zone: zones[i], InstanceType: types[i]}
		}
		ps = append(ps, p)
	}
	return ps
}

func repeat(s string, n int) []string { return slices.Repeat([]string{s}, n) }

// far counts the keeper → kept pairs in another zone, and in another zone
// or instance type.
func far(ps []checkpoint.PartInfo, k []int) (zone, any int) {
	for i, j := range k {
		a, b := site(ps[i]), site(ps[j])
		if a.otherZone(b) {
			zone++
		}
		if a.otherZone(b) || a.otherKind(b) {
			any++
		}
	}
	return zone, any
}

// checkCover fails unless every part has exactly one keeper, never itself.
func checkCover(t *testing.T, k []int) {
	t.Helper()
	kept := make([]int, len(k))
	for i, j := range k {
		if i == j {
			t.Fatalf("keeps %v: part %d keeps itself", k, i)
		}
		kept[j]++
	}
	for j, c := range kept {
		if c != 1 {
			t.Fatalf("keeps %v: part %d has %d keepers, want 1", k, j, c)
		}
	}
}

func TestPlacement(t *testing.T) {
	for _, c := range []struct {
		name          string
		zones, types  []string
		want          []int // nil: any cover with the far counts below
		wantZone, any int
	}{
		{name: "no metadata: the ring", zones: repeat("", 4), types: repeat("", 4), want: []int{1, 2, 3, 0}},
		{name: "one pool: the ring", zones: repeat("a", 3), types: repeat("p5", 3), want: []int{1, 2, 0}},
		{name: "two nodes", zones: []string{"a", "a"}, types: repeat("", 2), want: []int{1, 0}},
		{name: "zones in blocks", zones: []string{"a", "a", "b", "b"}, types: repeat("p5", 4), wantZone: 4, any: 4},
		{name: "zones interleaved", zones: []string{"a", "b", "a", "b", "a", "b"}, types: repeat("", 6), wantZone: 6, any: 6},
		{name: "three uneven zones", zones: []string{"a", "a", "a", "b", "c", "c"}, types: repeat("", 6), wantZone: 6, any: 6},
		// 5 in a, 1 in b: only b's part and b's keeper can be far (2(n-m)).
		{name: "one zone holds most", zones: []string{"a", "a", "b", "a", "a", "a"}, types: repeat("", 6), wantZone: 2, any: 2},
		{name: "one zone, two types", zones: repeat("a", 4), types: []string{"p5", "p5", "g6", "g6"}, wantZone: 0, any: 4},
		// Zones first, then types among what the zones leave near.
		{name: "zone then type", zones: []string{"a", "a", "a", "b"}, types: []string{"p5", "g6", "p5", "p5"}, wantZone: 2, any: 4},
		{name: "unknown zone is not far", zones: []string{"a", "", "a", ""}, types: repeat("", 4), want: []int{1, 2, 3, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := job(c.zones, c.types)
			k := keeps(ps)
			checkCover(t, k)
			if c.want != nil {
				if !slices.Equal(k, c.want) {
					t.Fatalf("keeps %v, want %v", k, c.want)
				}
				return
			}
			if z, a := far(ps, k); z != c.wantZone || a != c.any {
				t.Fatalf("keeps %v: %d pairs in another zone, %d in another zone or type; want %d, %d", k, z, a, c.wantZone, c.any)
			}
		})
	}
	if k := keeps(job([]string{"a"}, []string{""})); k != nil {
		t.Fatalf("one part: keeps %v, want none", k)
	}
}

// On random jobs of up to 7 parts, the placement covers every part once
// and is the same on every call. Where every zone is known, it puts as
// many copies in another zone as the best of all placements (every
// derangement, by brute force); where the job is in one zone and every
// type is known, as many on another instance type.
func TestPlacementBestOfAll(t *testing.T) {
	rng := rand.New(rand.NewPCG(38, 1))
	pick := func(set []string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = set[rng.IntN(len(set))]
		}
		return out
	}
	for try := range 600 {
		n := 2 + rng.IntN(6)
		var zones, types []string
		switch try % 3 {
		case 0: // every zone known
			zones, types = pick([]string{"a", "b", "c"}, n), pick([]string{"", "p5", "g6"}, n)
		case 1: // one zone, every type known
			zones, types = repeat("a", n), pick([]string{"p5", "g6", "m7"}, n)
		default: // metadata on some nodes only: a cover, no promise of the best
			zones, types = pick([]string{"", "a", "b"}, n), pick([]string{"", "p5"}, n)
		}
		ps := job(zones, types)
		k := keeps(ps)
		checkCover(t, k)
		if again := keeps(ps); !slices.Equal(k, again) {
			t.Fatalf("zones %v types %v: keeps %v, then %v", zones, types, k, again)
		}
		z, a := far(ps, k)
		bz, ba := best(ps)
		switch {
		case try%3 == 0 && z != bz:
			t.Fatalf("zones %v types %v: keeps %v has %d copies in another zone, the best placement %d", zones, types, k, z, bz)
		case try%3 == 1 && a != ba:
			t.Fatalf("zones %v types %v: keeps %v has %d copies on another type, the best placement %d", zones, types, k, a, ba)
		}
	}
}

// best is the most keeper → kept pairs in another zone, and in another
// zone or type, over every derangement of ps (each maximised alone).
func best(ps []checkpoint.PartInfo) (zone, any int) {
	n := len(ps)
	perm := make([]int, n)
	used := make([]bool, n)
	zone, any = -1, -1
	var walk func(i int)
	walk = func(i int) {
		if i == n {
			z, a := far(ps, perm)
			zone, any = max(zone, z), max(any, a)
			return
		}
		for j := range n {
			if !used[j] && j != i {
				used[j], perm[i] = true, j
				walk(i + 1)
				used[j] = false
			}
		}
	}
	walk(0)
	return zone, any
}

// The keeper and the replacement read the same answer from the manifest.
func TestKeptPartAndKeeper(t *testing.T) {
	m := &checkpoint.Manifest{ID: "c1", Step: 1, Parts: job([]string{"a", "a", "b", "b"}, repeat("", 4))}
	cl := NewClient(nil, "run", "node-9", nil, 0, nil)
	for _, p := range m.Parts {
		kept := keptPart(m, p.Node)
		if kept == "" || kept == p.Node {
			t.Fatalf("%s keeps %q", p.Node, kept)
		}
		if got := cl.keeperOf(m, kept); got != p.Node {
			t.Fatalf("keeper of %s: %q, want %s", kept, got, p.Node)
		}
	}
	if got := keptPart(m, "node-7"); got != "" {
		t.Fatalf("a node outside the job keeps %q", got)
	}
}

// With --replicas 1 on a 4-node job in two zones (nodes 0 and 1 in
// us-east-1a, 2 and 3 in us-east-1b), node 0 keeps a copy of a part in
// the other zone, not of its ring neighbour node 1; that part's node,
// replaced by an empty machine, restores its whole part from node 0,
// reading no data byte from the store.
func TestReplicaIsFar(t *testing.T) {
	ps := []checkpoint.PartSpec{{Node: "node-0", Ranks: []int{0}, WorldSize: 4}, {Node: "node-1", Ranks: []int{1}, WorldSize: 4},
		{Node: "node-2", Ranks: []int{2}, WorldSize: 4}, {Node: "node-3", Ranks: []int{3}, WorldSize: 4}}
	zone := func(z string) checkpoint.Machine {
		return checkpoint.Machine{Cloud: "aws", Zone: z, InstanceType: "p5.48xlarge"}
	}
	r := newRigOf(t, ps, []checkpoint.Machine{zone("us-east-1a"), zone("us-east-1a"), zone("us-east-1b"), zone("us-east-1b")})
	r.commit(0, 1, 2, 3)
	kept := keptPart(r.m, "node-0")
	if kept != "node-2" && kept != "node-3" {
		t.Fatalf("node-0 keeps %q, want a part in us-east-1b", kept)
	}
	k := int(kept[len(kept)-1] - '0')
	owner := r.serve(k, nil, 0)
	p0 := r.serveReplicas(0, nil, 0, 1)
	if err := p0.replicate(context.Background(), r.m); err != nil {
		t.Fatal(err)
	}
	owner.Close() // the kept part's machine is gone
	cl := NewClient(r.st, "run", kept, p0.token, 0, nil)
	res, err := restore.Checkpoint(context.Background(), r.st, t.TempDir(), restore.Options{Part: kept, Tiers: []checkpoint.Tier{cl}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.From[checkpoint.FromPeer], r.m.PartBytes(kept); got != want {
		t.Fatalf("From[peer]=%d, want %d (all of %s's part, from node 0)", got, want, kept)
	}
	if got := r.st.dataRead(); got != 0 {
		t.Fatalf("data bytes read from the store: %d, want 0", got)
	}
}

// A node's record names its machine (from the metadata), and none when
// the metadata said nothing.
func TestRecordNamesMachine(t *testing.T) {
	r := newRig(t)
	m := checkpoint.Machine{Cloud: "gcp", Zone: "us-central1-a", InstanceType: "a3-highgpu-8g"}
	for k, machine := range []checkpoint.Machine{m, {}} {
		p, err := Start(context.Background(), Config{Store: r.st, RunID: "run", Node: r.nodes[k].name, Listen: "127.0.0.1:0", Machine: machine})
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		rec, err := getRecord(context.Background(), r.st, r.nodes[k].name)
		if err != nil || rec == nil {
			t.Fatalf("record: %v %v", rec, err)
		}
		if machine == (checkpoint.Machine{}) {
			if rec.Machine != nil {
				t.Errorf("%s: machine %+v, want none", rec.Node, *rec.Machine)
			}
		} else if rec.Machine == nil || *rec.Machine != machine {
			t.Errorf("%s: machine %v, want %+v", rec.Node, rec.Machine, machine)
		}
	}
}
