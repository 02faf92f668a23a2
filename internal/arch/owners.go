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
	writes      map[string]int  // "pkg → other/pkg.Type.Field" → writes
	owned       map[string]bool // the keys of writes into an owner
	owners      map[string]bool // "pkg/path.Type" of the module's owners
	ownerWrites int             // of those, into an owner (findOwners)
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
//     Options, Flags) are wiring and exempt, as for the field count. A
//     write counts against the target when the struct is an owner: it
//     keeps state of its own, unexported, that only its methods change
//     (issue 49: "each owner's state unexported and changed only through
//     its methods"), so an exported field beside it is no one else's to
//     write either. A struct whose fields are all exported is a value,
//     plain data anyone may fill (a metadata.Notice, a checkpoint.Manifest
//     assembled by its producer, a journal record; a method that sets a
//     few of its fields is a convenience, no guard): its writes are
//     listed, not counted;
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
	o := &ownership{writes: map[string]int{}, owned: map[string]bool{}, owners: map[string]bool{}}
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		if strings.HasPrefix(p.PkgPath, module) {
			o.findOwners(p)
		}
	}
	for _, p := range pkgs {
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

// findOwners notes p's struct types that are owners: with an unexported
// field, state of their own that only their methods change.
func (o *ownership) findOwners(p *packages.Package) {
	for _, obj := range p.TypesInfo.Defs {
		tn, ok := obj.(*types.TypeName)
		if !ok || tn.Parent() != p.Types.Scope() {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for i := 0; i < st.NumFields(); i++ {
			if !st.Field(i).Exported() {
				o.owners[typeKey(tn)] = true
			}
		}
	}
}

// declaring is the named struct type that declares s's field: the
// receiver's, or for a promoted field the embedded type it comes from.
func declaring(s *types.Selection) *types.Named {
	t := s.Recv()
	idx := s.Index()
	var named *types.Named
	for i, fi := range idx {
		if ptr, ok := t.(*types.Pointer); ok {
			t = ptr.Elem()
		}
		named, _ = t.(*types.Named)
		st, ok := t.Underlying().(*types.Struct)
		if !ok {
			return nil
		}
		if i < len(idx)-1 {
			t = st.Field(fi).Type()
		}
	}
	return named
}

func typeKey(tn *types.TypeName) string { return tn.Pkg().Path() + "." + tn.Name() }

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
	named := declaring(s)
	if named == nil {
		return
	}
	name := named.Obj().Name()
	for _, suffix := range []string{"Config", "Options", "Flags"} {
		if strings.HasSuffix(name, suffix) {
			return
		}
	}
	owner, _ := strings.CutPrefix(named.Obj().Pkg().Path(), module+"/")
	key := fmt.Sprintf("%s → %s.%s.%s", rel, owner, name, field.Name())
	o.allWrites++
	if o.owners[typeKey(named.Obj())] {
		o.ownerWrites++
		o.owned[key] = true
	}
	o.writes[key]++
}

func (o *ownership) print(w io.Writer, mark func(bool) string) {
	fmt.Fprintf(w, "%s writes into another package's owners (a struct with unexported state; config, options and flag structs exempt): %d (target 0)\n",
		mark(o.ownerWrites == 0), o.ownerWrites)
	keys := make([]string, 0, len(o.owned))
	for k := range o.owned {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "       %s ×%d\n", k, o.writes[k])
	}
	fmt.Fprintf(w, "info writes into another package's plain values (every field exported): %d into %d fields (go run ./internal/arch -writes lists them)\n",
		o.allWrites-o.ownerWrites, len(o.writes)-len(o.owned))
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
		kind := "value"
		if o.owned[k] {
			kind = "owner"
		}
		fmt.Fprintf(w, "%4d %s %s\n", o.writes[k], kind, k)
	}
}
