package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The targets of issue 35, as issue 49 left them: the Agent's fields and
// methods and the packages' lines are printed for the reader, no longer
// targets (they forced splits by size; the ownership gauges, owners.go,
// measure what they stood for); the field limit holds for owners only.
const (
	maxFields     = 20
	pkgLinesNoted = 3000
	maxUpShare    = 0.20
	maxP90Lines   = 40
	maxFuncLines  = 100
)

const module = "github.com/spotagent/spotagent"

// report is what measure found.
type report struct {
	bigTypes      []string // "pkg.Type N" over maxFields
	agentFields   int
	agentMethods  int
	pkgLines      map[string]int
	calls, up     map[string]int // per package: calls between its files, and those that run back up
	unordered     []string       // packages with cross-file calls whose order the map does not give
	goCycles      [][]string
	pyCycles      [][]string
	funcs         []int // lines of each function outside bench/
	longest       []string
	agentByFile   map[string]int // Agent's methods per file
	typesMeasured int
}

// mapRow is one row of docs/architecture.md's file map: | package | what |
// files, top first | imports of ours |.
type mapRow struct {
	files   []string
	imports []string
}

var ticked = regexp.MustCompile("`([^`]+)`")

// readFileMap reads docs/architecture.md's file map ("## File map"): for
// each package directory, its files top first, and its imports of ours.
func readFileMap(root string) (map[string]mapRow, error) {
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows := map[string]mapRow{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## File map")
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			continue
		}
		pkg := ticked.FindStringSubmatch(cells[0])
		if pkg == nil {
			continue
		}
		var row mapRow
		for _, m := range ticked.FindAllStringSubmatch(cells[len(cells)-2], -1) {
			row.files = append(row.files, m[1])
		}
		for _, m := range ticked.FindAllStringSubmatch(cells[len(cells)-1], -1) {
			row.imports = append(row.imports, m[1])
		}
		rows[pkg[1]] = row
	}
	return rows, sc.Err()
}

func measure(root string) (*report, error) {
	files, err := goFiles(root)
	if err != nil {
		return nil, err
	}
	fmap, err := readFileMap(root)
	if err != nil {
		return nil, err
	}
	r := &report{pkgLines: map[string]int{}, calls: map[string]int{}, up: map[string]int{}, agentByFile: map[string]int{}}
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	names := map[*ast.File]string{}
	imports := map[string][]string{}
	type fl struct {
		n    int
		name string
	}
	var long []fl
	for _, gf := range files {
		af, err := parser.ParseFile(fset, filepath.Join(root, gf.path), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		byDir[gf.dir] = append(byDir[gf.dir], af)
		names[af] = filepath.Base(gf.path)
		r.pkgLines[gf.dir] += fset.File(af.Pos()).LineCount()
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if rel, ok := strings.CutPrefix(p, module+"/"); ok && !contains(imports[gf.dir], rel) {
				imports[gf.dir] = append(imports[gf.dir], rel)
			}
		}
		isMain := af.Name.Name == "main"
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						r.measureType(gf.dir, ts, isMain)
					}
				}
			case *ast.FuncDecl:
				if gf.dir == "pkg/supervisor" && recvName(d) == "Agent" {
					r.agentMethods++
					r.agentByFile[names[af]]++
				}
				if strings.HasPrefix(gf.path, "bench/") {
					continue
				}
				n := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
				r.funcs = append(r.funcs, n)
				long = append(long, fl{n, gf.path + ":" + funcName(d)})
			}
		}
	}
	sort.Slice(long, func(i, j int) bool { return long[i].n > long[j].n })
	for _, l := range long[:min(5, len(long))] {
		r.longest = append(r.longest, fmt.Sprintf("%s %d", l.name, l.n))
	}
	sort.Ints(r.funcs)
	r.goCycles = cycles(imports)
	py, err := pyGraph(root)
	if err != nil {
		return nil, err
	}
	r.pyCycles = cycles(py)
	for dir, afs := range byDir {
		order := map[string]int{}
		for i, f := range fmap[dir].files {
			order[f] = i
		}
		calls, up, ok := crossCalls(afs, names, order)
		r.calls[dir], r.up[dir] = calls, up
		if !ok && calls > 0 {
			r.unordered = append(r.unordered, dir)
		}
	}
	sort.Strings(r.unordered)
	sort.Strings(r.bigTypes)
	return r, nil
}

// measureType counts the fields of ts, declared in dir, when it is a
// struct that owns state (an unexported field; a struct of exported
// fields only is a value, whose fields are its format): a big one is
// listed, unless a command's or a flag or config struct.
func (r *report) measureType(dir string, ts *ast.TypeSpec, isMain bool) {
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return
	}
	n, owner := 0, false
	for _, f := range st.Fields.List {
		n += max(1, len(f.Names))
		for _, id := range f.Names {
			owner = owner || !id.IsExported()
		}
		if len(f.Names) == 0 {
			owner = owner || !ast.IsExported(embeddedName(f.Type))
		}
	}
	if dir == "pkg/supervisor" && ts.Name.Name == "Agent" {
		r.agentFields = n
	}
	if !owner {
		return
	}
	r.typesMeasured++
	if n > maxFields && !isMain && !exempt(ts.Name.Name) {
		r.bigTypes = append(r.bigTypes, fmt.Sprintf("%s.%s %d", dir, ts.Name.Name, n))
	}
}

// embeddedName is the type name of an embedded field's type expression.
func embeddedName(t ast.Expr) string {
	for {
		switch e := t.(type) {
		case *ast.StarExpr:
			t = e.X
		case *ast.SelectorExpr:
			return e.Sel.Name
		case *ast.IndexExpr:
			t = e.X
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// exempt: flag and config structs, which hold one field per setting.
func exempt(name string) bool {
	for _, s := range []string{"Config", "config", "Flags", "flags", "Options", "options"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

func recvName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func funcName(d *ast.FuncDecl) string {
	if r := recvName(d); r != "" {
		return r + "." + d.Name.Name
	}
	return d.Name.Name
}

// crossCalls counts the calls from one of the package's files to a
// function or method declared in another, each (calling function, called
// function) pair once, and those that run back up (to a file listed above
// the caller's). ok is false when a file of the
// package is missing from order.
func crossCalls(afs []*ast.File, names map[*ast.File]string, order map[string]int) (calls, up int, ok bool) {
	calls, up, ok, _ = crossEdges(afs, names, order)
	return calls, up, ok
}

// crossEdges is crossCalls with the calls' count per (from, to) file pair.
func crossEdges(afs []*ast.File, names map[*ast.File]string, order map[string]int) (calls, up int, ok bool, edges map[[2]string]int) {
	edges = map[[2]string]int{}
	funcs := map[string]string{}     // package-level function → file
	methods := map[string][]string{} // method name → files declaring it
	for _, af := range afs {
		for _, d := range af.Decls {
			fd, isFunc := d.(*ast.FuncDecl)
			if !isFunc {
				continue
			}
			if fd.Recv == nil {
				funcs[fd.Name.Name] = names[af]
			} else if !contains(methods[fd.Name.Name], names[af]) {
				methods[fd.Name.Name] = append(methods[fd.Name.Name], names[af])
			}
		}
	}
	ok = true
	for _, af := range afs {
		from := names[af]
		fi, known := order[from]
		if !known {
			ok = false
		}
		pkgNames := map[string]bool{}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			n := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				n = im.Name.Name
			}
			pkgNames[n] = true
		}
		for _, d := range af.Decls {
			fd, isFunc := d.(*ast.FuncDecl)
			if !isFunc || fd.Body == nil {
				continue
			}
			seen := map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				c, isCall := n.(*ast.CallExpr)
				if !isCall {
					return true
				}
				var to, callee string
				switch fn := c.Fun.(type) {
				case *ast.Ident:
					to, callee = funcs[fn.Name], fn.Name
				case *ast.SelectorExpr:
					if x, isID := fn.X.(*ast.Ident); isID && pkgNames[x.Name] {
						return true
					}
					if ms := methods[fn.Sel.Name]; len(ms) == 1 {
						to, callee = ms[0], "."+fn.Sel.Name
					}
				}
				if to == "" || to == from || seen[callee] {
					return true
				}
				seen[callee] = true
				calls++
				edges[[2]string{from, to}]++
				if ti, k := order[to]; k && known && ti < fi {
					up++
				}
				return true
			})
		}
	}
	return calls, up, ok, edges
}

// mark is a gauge's verdict.
func mark(ok bool) string {
	if ok {
		return "ok  "
	}
	return "MISS"
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "%s owners over %d fields (a struct with unexported state; flag and config structs exempt): %d of %d\n", mark(len(r.bigTypes) == 0), maxFields, len(r.bigTypes), r.typesMeasured)
	for _, t := range r.bigTypes {
		fmt.Fprintf(w, "       %s\n", t)
	}
	fmt.Fprintf(w, "info supervisor.Agent: %d fields, %d methods", r.agentFields, r.agentMethods)
	var byFile []string
	for f, n := range r.agentByFile {
		byFile = append(byFile, fmt.Sprintf("%s %d", f, n))
	}
	sort.Strings(byFile)
	fmt.Fprintf(w, " in %d files\n", len(byFile))
	var big []string
	dirs := sortedKeys(r.pkgLines)
	for _, d := range dirs {
		if r.pkgLines[d] > pkgLinesNoted {
			big = append(big, fmt.Sprintf("%s %d", d, r.pkgLines[d]))
		}
	}
	fmt.Fprintf(w, "info packages over %d non-test lines: %d of %d", pkgLinesNoted, len(big), len(dirs))
	if len(big) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(big, ", "))
	}
	fmt.Fprintln(w)
	var over []string
	tc, tu := 0, 0
	for _, d := range sortedKeys(r.calls) {
		c, u := r.calls[d], r.up[d]
		tc += c
		tu += u
		if c > 0 && float64(u) > maxUpShare*float64(c) {
			over = append(over, fmt.Sprintf("%s %d/%d", d, u, c))
		}
	}
	fmt.Fprintf(w, "%s calls between a package's files that run back up ≤ %.0f %% in each package: %d packages over", mark(len(over) == 0 && len(r.unordered) == 0), 100*maxUpShare, len(over))
	if len(over) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(over, ", "))
	}
	fmt.Fprintf(w, "; all packages %d of %d\n", tu, tc)
	fmt.Fprintf(w, "       pkg/supervisor %d of %d, pkg/checkpoint %d of %d\n", r.up["pkg/supervisor"], r.calls["pkg/supervisor"], r.up["pkg/checkpoint"], r.calls["pkg/checkpoint"])
	if len(r.unordered) > 0 {
		fmt.Fprintf(w, "       not in the file map (no order): %s\n", strings.Join(r.unordered, ", "))
	}
	fmt.Fprintf(w, "%s import circles: Go %d, Python %d", mark(len(r.goCycles)+len(r.pyCycles) == 0), len(r.goCycles), len(r.pyCycles))
	for _, c := range append(r.goCycles, r.pyCycles...) {
		fmt.Fprintf(w, " [%s]", strings.Join(c, " "))
	}
	fmt.Fprintln(w)
	p90, mx := 0, 0
	if n := len(r.funcs); n > 0 {
		p90, mx = r.funcs[(n*9+9)/10-1], r.funcs[n-1]
	}
	fmt.Fprintf(w, "%s function lines outside bench/: p90 %d (≤ %d), max %d (≤ %d) over %d functions; longest: %s\n",
		mark(p90 <= maxP90Lines && mx <= maxFuncLines), p90, maxP90Lines, mx, maxFuncLines, len(r.funcs), strings.Join(r.longest, ", "))
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
