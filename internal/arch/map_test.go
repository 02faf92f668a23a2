package main

import (
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const repoRoot = "../.."

// TestFileMap_EveryFileListed: docs/architecture.md's file map lists every
// non-test .go file of the module under its package, and no file that is
// gone.
func TestFileMap_EveryFileListed(t *testing.T) {
	rows, err := readFileMap(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	files, err := goFiles(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	onDisk := map[string]bool{}
	for _, f := range files {
		onDisk[f.path] = true
		row, ok := rows[f.dir]
		if !ok {
			t.Errorf("package %s (%s) has no row in the file map", f.dir, f.path)
			continue
		}
		if !slices.Contains(row.files, path.Base(f.path)) {
			t.Errorf("%s is not listed in the file map's row of %s", f.path, f.dir)
		}
	}
	for dir, row := range rows {
		for _, f := range row.files {
			if !onDisk[dir+"/"+f] {
				t.Errorf("the file map lists %s/%s, which is not a non-test .go file", dir, f)
			}
		}
	}
}

// TestFileMap_ImportsMatchGoList: each row's imports are the package's
// imports of this module as `go list` reports them (non-test files), and
// they run down the table: no package imports one listed above it.
func TestFileMap_ImportsMatchGoList(t *testing.T) {
	rows, err := readFileMap(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	order, err := mapOrder(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-tags", "disable_grpc_modules,grpcnotrace", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{len .GoFiles}}`, "./...")
	cmd.Dir = repoRoot
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		pkg := strings.TrimPrefix(f[0], module+"/")
		if f[2] == "0" {
			continue // tests only (integration, deploy/prometheus)
		}
		var want []string
		for _, im := range strings.Fields(f[1]) {
			if rel, ok := strings.CutPrefix(im, module+"/"); ok {
				want = append(want, rel)
			}
		}
		row, ok := rows[pkg]
		if !ok {
			t.Errorf("package %s has no row in the file map", pkg)
			continue
		}
		got := slices.Sorted(slices.Values(row.imports))
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s imports %v (go list), the file map says %v", pkg, want, got)
		}
		for _, im := range want {
			if order[im] < order[pkg] {
				t.Errorf("%s imports %s, which the file map lists above it: imports run down the table", pkg, im)
			}
		}
	}
}

// mapOrder is each package's row number in the file map.
func mapOrder(root string) (map[string]int, error) {
	b, err := os.ReadFile(root + "/docs/architecture.md")
	if err != nil {
		return nil, err
	}
	order := map[string]int{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## File map")
			continue
		}
		if m := ticked.FindStringSubmatch(line); in && strings.HasPrefix(line, "| `") && m != nil {
			order[m[1]] = len(order)
		}
	}
	return order, nil
}

// TestArch_Measures: make arch's measurement runs on the module and finds
// what is certainly there (Agent, and its file map's order for the
// supervisor).
func TestArch_Measures(t *testing.T) {
	r, err := measure(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if r.agentFields == 0 || r.agentMethods == 0 {
		t.Fatalf("supervisor.Agent not found: %d fields, %d methods", r.agentFields, r.agentMethods)
	}
	if r.calls["pkg/supervisor"] == 0 || slices.Contains(r.unordered, "pkg/supervisor") {
		t.Fatalf("pkg/supervisor's calls between files not measured: %d, unordered %v", r.calls["pkg/supervisor"], r.unordered)
	}
}

// TestCycles: an import circle is found, and a chain is none.
func TestCycles(t *testing.T) {
	if c := cycles(map[string][]string{"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}); len(c) != 1 || !slices.Equal(c[0], []string{"a", "b", "c"}) {
		t.Fatalf("cycles = %v, want [[a b c]]", c)
	}
	if c := cycles(map[string][]string{"a": {"b"}, "b": {"c"}}); len(c) != 0 {
		t.Fatalf("cycles of a chain = %v", c)
	}
}

// TestPrintMap_CurrentMapUnchanged: `-map` on a current file map prints
// the table as docs/architecture.md has it, so its output can replace it.
func TestPrintMap_CurrentMapUnchanged(t *testing.T) {
	var b strings.Builder
	if err := printMap(repoRoot, &b); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(repoRoot + "/docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), b.String()) {
		t.Fatalf("-map prints a table docs/architecture.md does not hold:\n%s", b.String())
	}
}
