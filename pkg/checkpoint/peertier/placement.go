package peertier

import (
	"cmp"
	"slices"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Placement: with --replicas 1 every node keeps a copy of one other
// node's part, and every part has one keeper, chosen far from it: spot
// capacity is reclaimed by pool (a zone and an instance type), so a copy
// in the same pool is likely lost with the part it copies.
//
// The choice is a function of the job checkpoint alone (its parts, in
// manifest order, and the machine that wrote each, PartInfo.Source): the
// keeper that copies and the replacement that asks compute the same
// answer from the same manifest, with no request to the store or each
// other, even when the replaced machine is now in another zone.
//
// The parts are sorted by (cloud and zone, instance type), ties in
// manifest order, and part i of that order is kept by part i-s, for the
// shift s in 1..n-1 that makes the most pairs far: first in another zone,
// then in another zone or instance type; the smallest s on a tie. A
// cyclic shift is a permutation without a fixed point, so every part has
// exactly one keeper and no node keeps its own. When no zone group holds
// more than half the parts, s = the largest group's size puts every copy
// in another zone; when one does (m > n/2), 2(n-m) pairs can be far, and
// that same shift reaches it. When nothing is known to be far (no
// metadata, or one pool) it is the ring: node k keeps node k+1's part.
// A job whose machines' zones are known for some parts and not others
// (metadata that failed on a few nodes) gets a cover, but not always the
// most copies in another zone.
//
// Cost: n² comparisons (10⁶ at 1,000 nodes, milliseconds), once per
// checkpoint on each side.

// keeps returns, for each part of parts (by index), the index of the part
// its node keeps a copy of; nil when there are fewer than 2 parts.
func keeps(parts []checkpoint.PartInfo) []int {
	n := len(parts)
	if n < 2 {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		sa, sb := site(parts[a]), site(parts[b])
		if c := cmp.Compare(sa.zone, sb.zone); c != 0 {
			return c
		}
		return cmp.Compare(sa.kind, sb.kind)
	})
	sites := make([]place, n)
	for i, k := range order {
		sites[i] = site(parts[k])
	}
	best, bestZone, bestAny := 1, -1, -1
	for s := 1; s < n; s++ {
		zone, any := 0, 0
		for i := range n {
			a, b := sites[i], sites[(i+s)%n]
			switch {
			case a.otherZone(b):
				zone++
				any++
			case a.otherKind(b):
				any++
			}
		}
		if zone > bestZone || zone == bestZone && any > bestAny {
			best, bestZone, bestAny = s, zone, any
		}
	}
	if bestAny == 0 {
		// Nothing known to be far: the ring, in manifest order.
		for i := range order {
			order[i] = i
		}
	}
	out := make([]int, n)
	for i, k := range order {
		out[k] = order[(i+best)%n]
	}
	return out
}

// place is where a part's machine ran: its capacity pool, as far as the
// metadata told.
type place struct {
	zone string // "<cloud>/<zone>"; "": unknown
	kind string // instance type; "": unknown
}

func site(p checkpoint.PartInfo) place {
	if p.Source == nil {
		return place{}
	}
	var s place
	if p.Source.Zone != "" {
		s.zone = p.Source.Cloud + "/" + p.Source.Zone
	}
	s.kind = p.Source.InstanceType
	return s
}

// otherZone: both zones known, and different. An unknown zone is never
// counted far: the shift cannot promise what the metadata did not say.
func (a place) otherZone(b place) bool { return a.zone != "" && b.zone != "" && a.zone != b.zone }

// otherKind: both instance types known, and different.
func (a place) otherKind(b place) bool { return a.kind != "" && b.kind != "" && a.kind != b.kind }

// keptPart is the part node keeps a copy of in checkpoint m (--replicas
// 1); "" when node is not a part of m or m has fewer than 2 parts.
func keptPart(m *checkpoint.Manifest, node string) string {
	k := keeps(m.Parts)
	for i, p := range m.Parts {
		if p.Node == node && k != nil {
			return m.Parts[k[i]].Node
		}
	}
	return ""
}
