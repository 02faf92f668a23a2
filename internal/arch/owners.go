package main

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

// Gauges of ownership (issue 49 item 6): they measure who writes whose
// state, which the size limits above only approximate.
const (
	maxIfaceMethods = 8 // a callback interface a mode needs
)

// ownership is what the type-checked gauges found.
type ownership struct {
	writes      map[string]int // "pkg → other/pkg.Type.Field" → writes
	ownerWrites int            // of those, into a type with methods (an owner)
	allWrites   int
	bigIfaces   []string // "pkg.Iface N"
	untested    []string // package dirs without a _test.go file
	packages    int
}

// measureOwnership type-checks the module's non-test packages and counts
//   - writes into another package's exported struct fields: an
//     assignment, op-assignment or ++/-- whose left side is x.F (or x.F[i],
//     *x.F) where F is a field of a struct type declared in another
//     package of this module. Composite literals are construction, not
//     writes. Config, options and flag structs (a name ending in Config,
//     Options, Flags) are wiring and exempt, as for the field count;
//   - interfaces of this module with more than maxIfaceMethods methods;
//   - packages without any _test.go file, outside cmd/ and test helpers
//     (a directory whose last element contains "test").
func measureOwnership(root string) (*ownership, error) {
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir: root, Tests: false, BuildFlags: []string{"-tags", "disable_grpc_modules,grpcnotrace"}}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	o := &ownership{writes: map[string]int{}}
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		rel, ok := strings.CutPrefix(p.PkgPath, module+"/")
		if !ok {
			continue
		}
		o.packages++
		o.tests(root, rel)
		for _, f := range p.Syntax {
			o.file(p, rel, f)
		}
	}
	sort.Strings(o.bigIfaces)
	sort.Strings(o.untested)
	return o, nil
}

// tests notes a package directory without tests.
func (o *ownership) tests(root, rel string) {
	if strings.HasPrefix(rel, "cmd/") || strings.Contains(filepath.Base(rel), "test") {
		return
	}
	ents, _ := os.ReadDir(filepath.Join(root, rel))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), "_test.go") {
			return
		}
	}
	o.untested = append(o.untested, rel)
}

func (o *ownership) file(p *packages.Package, rel string, f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				return true
			}
			for _, l := range n.Lhs {
				o.write(p, rel, l)
			}
		case *ast.IncDecStmt:
			o.write(p, rel, n.X)
		case *ast.TypeSpec:
			if it, ok := p.TypesInfo.Defs[n.Name].Type().Underlying().(*types.Interface); ok && it.NumMethods() > maxIfaceMethods {
				o.bigIfaces = append(o.bigIfaces, fmt.Sprintf("%s.%s %d", rel, n.Name.Name, it.NumMethods()))
			}
		}
		return true
	})
}

// write counts lhs when it is a field of a struct type declared in
// another package of the module.
func (o *ownership) write(p *packages.Package, rel string, lhs ast.Expr) {
	for {
		switch e := lhs.(type) {
		case *ast.IndexExpr:
			lhs = e.X
			continue
		case *ast.StarExpr:
			lhs = e.X
			continue
		case *ast.ParenExpr:
			lhs = e.X
			continue
		}
		break
	}
	sel, ok := lhs.(*ast.SelectorExpr)
	if !ok {
		return
	}
	s := p.TypesInfo.Selections[sel]
	if s == nil || s.Kind() != types.FieldVal {
		return
	}
	field := s.Obj()
	if field.Pkg() == nil || field.Pkg() == p.Types || !strings.HasPrefix(field.Pkg().Path(), module) {
		return
	}
	recv := s.Recv()
	if ptr, ok := recv.(*types.Pointer); ok {
		recv = ptr.Elem()
	}
	named, ok := recv.(*types.Named)
	if !ok {
		return
	}
	name := named.Obj().Name()
	for _, suffix := range []string{"Config", "Options", "Flags"} {
		if strings.HasSuffix(name, suffix) {
			return
		}
	}
	owner, _ := strings.CutPrefix(named.Obj().Pkg().Path(), module+"/")
	o.allWrites++
	if named.NumMethods() > 0 || types.NewMethodSet(types.NewPointer(named)).Len() > 0 {
		o.ownerWrites++
	}
	o.writes[fmt.Sprintf("%s → %s.%s.%s", rel, owner, name, field.Name())]++
}

func (o *ownership) print(w io.Writer, mark func(bool) string) {
	fmt.Fprintf(w, "%s writes into another package's exported fields (config, options and flag structs exempt): %d, %d of them into types with methods (target 0)\n",
		mark(o.allWrites == 0), o.allWrites, o.ownerWrites)
	type kv struct {
		k string
		n int
	}
	var top []kv
	for k, n := range o.writes {
		top = append(top, kv{k, n})
	}
	sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n || top[i].n == top[j].n && top[i].k < top[j].k })
	for _, t := range top[:min(8, len(top))] {
		fmt.Fprintf(w, "       %s ×%d\n", t.k, t.n)
	}
	if len(top) > 8 {
		fmt.Fprintf(w, "       … %d more fields (go run ./internal/arch -writes lists them all)\n", len(top)-8)
	}
	fmt.Fprintf(w, "%s interfaces over %d methods: %d", mark(len(o.bigIfaces) == 0), maxIfaceMethods, len(o.bigIfaces))
	if len(o.bigIfaces) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(o.bigIfaces, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%s packages without tests (outside cmd/ and test helpers): %d of %d", mark(len(o.untested) == 0), len(o.untested), o.packages)
	if len(o.untested) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(o.untested, ", "))
	}
	fmt.Fprintln(w)
}

// printWrites lists every counted field write, most written first.
func (o *ownership) printWrites(w io.Writer) {
	keys := make([]string, 0, len(o.writes))
	for k := range o.writes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return o.writes[keys[i]] > o.writes[keys[j]] || o.writes[keys[i]] == o.writes[keys[j]] && keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Fprintf(w, "%4d %s\n", o.writes[k], k)
	}
}
