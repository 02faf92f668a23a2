package fleet

import (
	"bytes"
	"encoding/xml"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// svgCount parses one SVG document and counts its elements by name and
// class ("circle.interruption").
func svgCount(t *testing.T, doc string) map[string]int {
	t.Helper()
	n := map[string]int{}
	dec := xml.NewDecoder(strings.NewReader(doc))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return n
		}
		if err != nil {
			t.Fatalf("svg does not parse: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			n[se.Name.Local]++
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					n[se.Name.Local+"."+a.Value]++
				}
			}
		}
	}
}

func TestWriteHTML(t *testing.T) {
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
			o.Prices.Default = Price{Spot: 2, OnDemand: 6}
		}
		rep, err := Build(s, o, "recount", damaged)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := Write(&b, rep, "html"); err != nil {
			t.Fatal(err)
		}
		page := b.String()
		svgs := regexp.MustCompile(`(?s)<svg id="(\w+)".*?</svg>`).FindAllStringSubmatch(page, -1)
		if len(svgs) != 2 || svgs[0][1] != "interruptions" || svgs[1][1] != "breakdown" {
			t.Fatalf("priced %v: want the interruptions and breakdown charts, got %d svg", priced, len(svgs))
		}
		in := svgCount(t, svgs[0][0])
		if got, want := in["circle.interruption"], len(rep.Interruptions); got != want || want != 2 {
			t.Errorf("priced %v: %d interruption dots, want %d", priced, got, want)
		}
		if !strings.Contains(svgs[0][0], `fill="`+colorOK+`"`) || !strings.Contains(svgs[0][0], `fill="`+colorLost+`"`) {
			t.Errorf("priced %v: want one committed (green) and one lost (red) dot:\n%s", priced, svgs[0][0])
		}
		br := svgCount(t, svgs[1][0])
		if br["rect.hours"] < len(rep.Cells)+1 {
			t.Errorf("priced %v: %d hour bars for %d cells and the fleet", priced, br["rect.hours"], len(rep.Cells))
		}
		if priced != (br["rect.money"] > 0) || priced != (br["rect.on-demand"] == len(rep.Cells)+1) {
			t.Errorf("priced %v: %d money bars, %d on-demand outlines", priced, br["rect.money"], br["rect.on-demand"])
		}
		for _, want := range []string{"gcp/a2-highgpu-1g/us-central1-a", "damaged journal broken/journal.json", "<table id=\"cells\">"} {
			if !strings.Contains(page, want) {
				t.Errorf("priced %v: page lacks %q", priced, want)
			}
		}
		// The table is well formed: every row has the header's cells.
		table := regexp.MustCompile(`(?s)<table id="cells">.*?</table>`).FindString(page)
		tc := svgCount(t, table)
		if tc["tr"] != len(rep.Cells)+2 || tc["td"] != (len(rep.Cells)+1)*tc["th"] {
			t.Errorf("priced %v: table %d rows, %d th, %d td", priced, tc["tr"], tc["th"], tc["td"])
		}
	}
}
