package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// goFile is one non-test .go file of the module.
type goFile struct {
	path string // relative to the root, slash-separated
	dir  string // its package's directory
}

// goFiles lists the module's non-test .go files (tools/ is a module of its
// own; testdata is not code).
func goFiles(root string) ([]goFile, error) {
	var out []goFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "tools" && filepath.Dir(rel) == "." || name == "node_modules" || name == "python" && filepath.Dir(rel) == ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			out = append(out, goFile{path: rel, dir: filepath.ToSlash(filepath.Dir(rel))})
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, err
}

// pyImports is the Python client's import graph: module → modules of the
// package it imports.
var pyImport = regexp.MustCompile(`(?m)^\s*(?:from\s+(\.[\w.]*|spotagent[\w.]*)\s+import\s+([\w, ]+)|import\s+(spotagent[\w.]*))`)

func pyGraph(root string) (map[string][]string, error) {
	dir := filepath.Join(root, "python", "spotagent")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	mods := map[string]bool{}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".py") {
			mods[strings.TrimSuffix(e.Name(), ".py")] = true
		}
	}
	g := map[string][]string{}
	for m := range mods {
		b, err := os.ReadFile(filepath.Join(dir, m+".py"))
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		add := func(t string) {
			if mods[t] && t != m && !seen[t] {
				seen[t] = true
				g[m] = append(g[m], t)
			}
		}
		for _, s := range pyImport.FindAllStringSubmatch(string(b), -1) {
			switch {
			case s[3] != "":
				add(strings.TrimPrefix(strings.TrimPrefix(s[3], "spotagent"), "."))
			case s[1] == "." || s[1] == "spotagent":
				for _, n := range strings.Split(s[2], ",") {
					add(strings.Fields(n + " _")[0])
				}
			default:
				t := strings.TrimPrefix(strings.TrimPrefix(s[1], "spotagent"), ".")
				add(strings.SplitN(t, ".", 2)[0])
			}
		}
		sort.Strings(g[m])
	}
	return g, nil
}

// cycles returns the strongly connected components of g with more than one
// member (or a member importing itself): each is an import circle.
func cycles(g map[string][]string) [][]string {
	index, low := map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack []string
	var out [][]string
	n := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = n, n
		n++
		stack = append(stack, v)
		on[v] = true
		for _, w := range g[v] {
			if _, ok := index[w]; !ok {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var c []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			c = append(c, w)
			if w == v {
				break
			}
		}
		if len(c) > 1 {
			sort.Strings(c)
			out = append(out, c)
		}
	}
	keys := make([]string, 0, len(g))
	for k := range g {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := index[k]; !ok {
			visit(k)
		}
	}
	return out
}
