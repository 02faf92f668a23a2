package main

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// printMap prints the file map's table as it should read now: the rows of
// docs/architecture.md in their order with their descriptions, each
// package's listed files in their order, files new on disk appended, files
// gone dropped, imports as the source says; a package the map lacks comes
// last, described "TODO" (place it above what it imports).
func printMap(root string, w io.Writer) error {
	files, err := goFiles(root)
	if err != nil {
		return err
	}
	byDir := map[string][]string{}
	imports := map[string][]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		byDir[f.dir] = append(byDir[f.dir], filepath.Base(f.path))
		af, err := parser.ParseFile(fset, filepath.Join(root, f.path), nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if rel, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(imports[f.dir], rel) {
				imports[f.dir] = append(imports[f.dir], rel)
			}
		}
	}
	rows, order, what, err := mapRows(root)
	if err != nil {
		return err
	}
	for d := range byDir {
		if !slices.Contains(order, d) {
			order = append(order, d)
		}
	}
	fmt.Fprintln(w, "| package | what lives there | files, top first | imports (of ours) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- |")
	for _, d := range order {
		if len(byDir[d]) == 0 {
			continue // gone
		}
		var fs []string
		for _, f := range rows[d].files {
			if slices.Contains(byDir[d], f) {
				fs = append(fs, f)
			}
		}
		for _, f := range byDir[d] {
			if !slices.Contains(fs, f) {
				fs = append(fs, f)
			}
		}
		desc := what[d]
		if desc == "" {
			desc = "TODO"
		}
		ims := slices.Sorted(slices.Values(imports[d]))
		fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", d, desc, ticks(fs), orNone(ticks(ims)))
	}
	return nil
}

func ticks(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = "`" + x + "`"
	}
	return strings.Join(q, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// mapRows is readFileMap with the rows' order and descriptions.
func mapRows(root string) (map[string]mapRow, []string, map[string]string, error) {
	rows, err := readFileMap(root)
	if err != nil {
		return nil, nil, nil, err
	}
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	var order []string
	what := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## File map")
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !in || !strings.HasPrefix(line, "| `") || len(cells) < 4 {
			continue
		}
		if m := ticked.FindStringSubmatch(cells[0]); m != nil {
			order = append(order, m[1])
			what[m[1]] = strings.TrimSpace(strings.Join(cells[1:len(cells)-2], "|"))
		}
	}
	return rows, order, what, sc.Err()
}
