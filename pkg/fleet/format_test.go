package fleet

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// The default table fits a 120-column terminal, priced or not, with run
// ids cut at runIDWidth; "wide" has every column and whole ids (#41 item 8).
func TestWriteTable_Width(t *testing.T) {
	root := t.TempDir()
	writeFleet(t, func(dir string) cloud.Store {
		s, err := file.New(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
	st, _ := file.New(root)
	now := at(100 * time.Hour)
	s, damaged, err := Recount(t.Context(), st, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, priced := range []bool{false, true} {
		o := Options{Now: now}
		if priced {
			o.Prices.Default = Price{Spot: 1234.5, OnDemand: 4000} // wide money figures
		}
		rep, err := Build(s, o, "recount", damaged)
		if err != nil {
			t.Fatal(err)
		}
		long := "llm-pretrain-70b-experiment-42"
		rep.Runs[0].ID = long
		var narrow, wide bytes.Buffer
		if err := Write(&narrow, rep, "table"); err != nil {
			t.Fatal(err)
		}
		if err := Write(&wide, rep, "wide"); err != nil {
			t.Fatal(err)
		}
		t.Logf("priced %v:\n%s", priced, narrow.String())
		for i, line := range strings.Split(narrow.String(), "\n") {
			if strings.HasPrefix(line, "  ") {
				continue // a damaged journal's problem, one a line, as the reader words it
			}
			if n := utf8.RuneCountInString(line); n > TableWidth {
				t.Errorf("priced %v: line %d is %d columns, more than %d:\n%s", priced, i+1, n, TableWidth, line)
			}
		}
		for _, want := range []string{"INTR", "RATE/H", "GOODPUT", cut(long, runIDWidth) + " "} {
			if !strings.Contains(narrow.String(), want) {
				t.Errorf("priced %v: the table lacks %q", priced, want)
			}
		}
		if priced && !strings.Contains(narrow.String(), "WASTED") {
			t.Errorf("the priced table lacks WASTED")
		}
		for _, want := range []string{"RATE/H (90 %)", "NOTICE LEAD MEDIAN/SHORTEST", "BETWEEN/INTERRUPTION", long} {
			if !strings.Contains(wide.String(), want) {
				t.Errorf("priced %v: the wide table lacks %q", priced, want)
			}
		}
		if w := maxLine(wide.String()); w <= TableWidth {
			t.Errorf("priced %v: the wide table is %d columns: no wider than the default", priced, w)
		}
	}
}

func maxLine(s string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		n = max(n, utf8.RuneCountInString(l))
	}
	return n
}
