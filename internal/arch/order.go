package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"sort"
)

// suggestOrder prints, for each package with more than one file, an order
// of its files in which few calls run back up (Eades, Lin and Smyth's
// heuristic for a small feedback arc set): a starting point for the file
// map's order, which is then the documented one.
func suggestOrder(root string, w io.Writer) error {
	files, err := goFiles(root)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	names := map[*ast.File]string{}
	for _, gf := range files {
		af, err := parser.ParseFile(fset, filepath.Join(root, gf.path), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		byDir[gf.dir] = append(byDir[gf.dir], af)
		names[af] = filepath.Base(gf.path)
	}
	dirs := make([]string, 0, len(byDir))
	for d := range byDir {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		var nodes []string
		for _, af := range byDir[d] {
			nodes = append(nodes, names[af])
		}
		_, _, _, edges := crossEdges(byDir[d], names, nil)
		order := eades(nodes, edges)
		if len(nodes) <= 7 {
			order = fewestUp(nodes, edges)
		}
		pos := map[string]int{}
		for i, n := range order {
			pos[n] = i
		}
		calls, up, _ := crossCalls(byDir[d], names, pos)
		fmt.Fprintf(w, "%s (%d of %d up):", d, up, calls)
		for _, n := range order {
			fmt.Fprintf(w, " `%s`,", n)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// eades orders nodes so that few weighted edges run from a later node to
// an earlier one: sinks go to the end, sources to the front, else the node
// whose outgoing weight most exceeds its incoming goes to the front.
func eades(nodes []string, edges map[[2]string]int) []string {
	left := map[string]bool{}
	for _, n := range nodes {
		left[n] = true
	}
	weight := func(n string, out bool) int {
		s := 0
		for e, c := range edges {
			if out && e[0] == n && left[e[1]] || !out && e[1] == n && left[e[0]] {
				s += c
			}
		}
		return s
	}
	sort.Strings(nodes)
	var front, back []string
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, n := range nodes {
				if !left[n] {
					continue
				}
				if weight(n, true) == 0 {
					back = append([]string{n}, back...)
					delete(left, n)
					changed = true
				} else if weight(n, false) == 0 {
					front = append(front, n)
					delete(left, n)
					changed = true
				}
			}
		}
		best, bestD := "", 0
		for _, n := range nodes {
			if !left[n] {
				continue
			}
			if d := weight(n, true) - weight(n, false); best == "" || d > bestD {
				best, bestD = n, d
			}
		}
		if best != "" {
			front = append(front, best)
			delete(left, best)
		}
	}
	return append(front, back...)
}

// fewestUp tries every order of a few files and keeps the first with the
// fewest weighted edges running back up.
func fewestUp(nodes []string, edges map[[2]string]int) []string {
	sort.Strings(nodes)
	best, bestUp := append([]string(nil), nodes...), -1
	perm := append([]string(nil), nodes...)
	var try func(k int)
	try = func(k int) {
		if k == len(perm) {
			pos := map[string]int{}
			for i, n := range perm {
				pos[n] = i
			}
			up := 0
			for e, c := range edges {
				if pos[e[1]] < pos[e[0]] {
					up += c
				}
			}
			if bestUp < 0 || up < bestUp {
				best, bestUp = append(best[:0], perm...), up
			}
			return
		}
		for i := k; i < len(perm); i++ {
			perm[k], perm[i] = perm[i], perm[k]
			try(k + 1)
			perm[k], perm[i] = perm[i], perm[k]
		}
	}
	try(0)
	return best
}
