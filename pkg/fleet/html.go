package fleet

import (
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
	"time"
)

// svg geometry of the two charts.
// svgWidth fits a 1280-pixel window with the page's margins; the charts
// also shrink with a narrower one (max-width: 100 %).
const (
	svgWidth     = 1100
	svgLeft      = 260 // room for the cell names (cut at svgNameChars)
	svgRight     = 20
	svgLabels    = 300 // right of the breakdown's bars: their hour and money labels
	svgNameChars = 36
	svgLane      = 26
	svgTop       = 30
	svgBottom    = 40
	colorOK      = "#2e7d32" // notice checkpoint committed
	colorLost    = "#c62828" // work lost
	colorGood    = "#1565c0" // productive
	colorBlock   = "#90caf9" // blocked in checkpoints
	colorWaste   = "#ef6c00" // lost + restore + after an interruption
	colorGap     = "#bdbdbd" // between machines
)

// writeHTML writes rep as one self-contained HTML page: the fleet table,
// interruptions over time (one lane per cell, a dot per interruption:
// green when its notice checkpoint committed, red when work was lost) and
// where each cell's time and money went (stacked bars). No scripts, no
// external resources: it opens from a file or an email attachment.
func writeHTML(w io.Writer, rep *Report) error {
	return pageTmpl.Execute(w, map[string]any{
		"R":             rep,
		"Interruptions": template.HTML(interruptionsSVG(rep)),
		"Breakdown":     template.HTML(breakdownSVG(rep)),
		"Rows":          htmlRows(rep),
	})
}

type htmlRow struct {
	Name  string
	Cells []string
}

func htmlRows(rep *Report) []htmlRow {
	var rows []htmlRow
	add := func(name string, f *Figures) {
		r := htmlRow{Name: name}
		for _, c := range columns {
			if _, ok := c.shown(true, rep.Total.Money != nil); ok {
				v := c.table(f)
				if c.head == restoredHead {
					v = restoredFrom(f, "\n") // a source a line
				}
				r.Cells = append(r.Cells, htmlCell(v))
			}
		}
		rows = append(rows, r)
	}
	for i := range rep.Cells {
		k := rep.Cells[i].Key.String() // cloud/type/ on one line, the zone below
		if j := strings.LastIndex(k, "/"); j >= 0 {
			k = k[:j+1] + "\n" + k[j+1:]
		}
		add(k, &rep.Cells[i].Figures)
	}
	add("fleet", &rep.Total)
	return rows
}

// htmlCell puts a figure's parenthesis on a line of its own ("0.0768
// (0.0039–0.3644)" on two lines; td is white-space: pre, so nothing else
// wraps): the table then fits a 1280-pixel window.
func htmlCell(v string) string { return strings.ReplaceAll(v, " (", "\n(") }

// breakAfterSlash lets a head wrap after its slashes.
func breakAfterSlash(s string) string { return strings.ReplaceAll(s, "/", "/\u200b") }

func htmlHeads(rep *Report) []string {
	var h []string
	for _, c := range columns {
		if head, ok := c.shown(true, rep.Total.Money != nil); ok {
			h = append(h, breakAfterSlash(head))
		}
	}
	return h
}

var pageTmpl = template.Must(template.New("fleet").Funcs(template.FuncMap{
	"heads": htmlHeads,
	"mulf":  func(v float64) float64 { return 100 * v },
	"join":  strings.Join,
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>spotagent fleet</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #212121; }
table { border-collapse: collapse; font-size: 11px; }
th, td { border: 1px solid #ddd; padding: 3px 5px; text-align: right; }
td { white-space: pre; }
th { vertical-align: bottom; }
svg { max-width: 100%; height: auto; }
th:first-child, td:first-child { text-align: left; }
tr:last-child td { font-weight: bold; }
svg text { font-size: 12px; fill: #424242; }
.damaged { color: #c62828; }
</style>
</head>
<body>
<h1>spotagent fleet</h1>
<p>{{.R.Total.Runs}} run(s), {{printf "%.1f" .R.Total.MachineHours}} machine hours, {{.R.Total.Interruptions}} interruption(s), goodput {{printf "%.1f" (mulf .R.Total.Goodput)}} % — from the {{.R.Source}}, {{.R.Generated.Format "2006-01-02 15:04 UTC"}}.</p>
<table id="cells">
<tr><th>cloud/&#8203;instance type/&#8203;zone</th>{{range heads .R}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Name}}</td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
<h2>Interruptions over time</h2>
{{.Interruptions}}
<h2>Where the time{{if .R.Total.Money}} and money{{end}} went</h2>
{{.Breakdown}}
{{range .R.Damaged}}<p class="damaged">damaged journal {{.Key}}{{if .Counted}} (the rest counted){{else}} (not counted){{end}}: {{join .Problems "; "}}</p>
{{end}}<p>How each figure is computed: docs/fleet.md.</p>
</body>
</html>
`))

// esc escapes text for SVG (XML).
func esc(s string) string { return template.HTMLEscapeString(s) }

// interruptionsSVG draws one lane per cell over the report's time span.
func interruptionsSVG(rep *Report) string {
	lanes := make([]Key, 0, len(rep.Cells))
	for _, c := range rep.Cells {
		lanes = append(lanes, c.Key)
	}
	from, to := rep.Generated, rep.Generated
	for _, r := range rep.Runs {
		if r.Start.Before(from) {
			from = r.Start
		}
	}
	for _, in := range rep.Interruptions {
		if in.At.After(to) {
			to = in.At
		}
	}
	if !to.After(from) {
		to = from.Add(time.Hour)
	}
	height := svgTop + svgLane*max(len(lanes), 1) + svgBottom
	plotW := float64(svgWidth - svgLeft - svgRight)
	x := func(t time.Time) float64 {
		return svgLeft + plotW*t.Sub(from).Seconds()/to.Sub(from).Seconds()
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="interruptions" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<text x="%d" y="18">%s notice checkpoint committed · %s work lost</text>`+"\n", svgLeft, dot(colorOK), dot(colorLost))
	for i, k := range lanes {
		y := svgTop + svgLane*i + svgLane/2
		fmt.Fprintf(&b, `<text x="4" y="%d">%s</text>`+"\n", y+4, esc(cut(k.String(), svgNameChars)))
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#e0e0e0"/>`+"\n", svgLeft, y, svgWidth-svgRight, y)
	}
	for _, in := range rep.Interruptions {
		i := slices.Index(lanes, in.Key)
		if i < 0 {
			continue
		}
		color, what := colorLost, "work lost"
		if in.Committed {
			color, what = colorOK, "notice checkpoint committed"
		}
		fmt.Fprintf(&b, `<circle class="interruption" cx="%.1f" cy="%d" r="5" fill="%s"><title>%s %s: %s</title></circle>`+"\n",
			x(in.At), svgTop+svgLane*i+svgLane/2, color, esc(in.Run), in.At.UTC().Format(time.DateTime), what)
	}
	axisY := svgTop + svgLane*max(len(lanes), 1) + 16
	for i := 0; i <= 4; i++ {
		t := from.Add(time.Duration(float64(to.Sub(from)) * float64(i) / 4))
		anchor := map[int]string{0: "start", 4: "end"}[i] // the ends stay inside the chart
		if anchor == "" {
			anchor = "middle"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%d" text-anchor="%s">%s</text>`+"\n", x(t), axisY, anchor, t.UTC().Format("2006-01-02 15:04"))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// breakdownSVG draws, per cell and for the fleet, the wall time split into
// productive, blocked, wasted (lost + restore + after an interruption) and
// between machines; with prices, a second bar splits the spend into useful
// and wasted next to what the same work would have cost on demand.
func breakdownSVG(rep *Report) string {
	type bar struct {
		name string
		f    *Figures
	}
	bars := make([]bar, 0, len(rep.Cells)+1)
	for i := range rep.Cells {
		bars = append(bars, bar{rep.Cells[i].Key.String(), &rep.Cells[i].Figures})
	}
	bars = append(bars, bar{"fleet", &rep.Total})
	priced := rep.Total.Money != nil
	per := svgLane
	if priced {
		per = 2 * svgLane
	}
	top := svgTop
	if priced {
		top += 16 // the money legend's line
	}
	height := top + per*len(bars) + svgBottom
	plotW := float64(svgWidth - svgLeft - svgRight - svgLabels)
	var maxHours, maxMoney float64
	for _, br := range bars[:len(bars)-1] { // cells: the fleet bar gets its own scale
		maxHours = max(maxHours, br.f.WallHours)
		if m := br.f.Money; m != nil {
			maxMoney = max(maxMoney, m.Spend, m.OnDemand)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="breakdown" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<text x="%d" y="18">hours: %s productive · %s blocked · %s wasted by interruptions · %s between machines</text>`+"\n",
		svgLeft, dot(colorGood), dot(colorBlock), dot(colorWaste), dot(colorGap))
	if priced {
		fmt.Fprintf(&b, `<text x="%d" y="34">money: %s useful spend · %s wasted · ▭ on demand (dashed outline)</text>`+"\n",
			svgLeft, dot(colorGood), dot(colorWaste))
	}
	segs := func(y int, scale float64, parts []float64, colors []string, class string) float64 {
		xx := float64(svgLeft)
		for i, v := range parts {
			if v <= 0 || scale <= 0 {
				continue
			}
			w := plotW * v / scale
			fmt.Fprintf(&b, `<rect class="%s" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", class, xx, y, w, svgLane-8, colors[i])
			xx += w
		}
		return xx
	}
	for i, br := range bars {
		y := top + per*i
		f := br.f
		scaleH, scaleM := maxHours, maxMoney
		if i == len(bars)-1 {
			scaleH = f.WallHours
			if f.Money != nil {
				scaleM = max(f.Money.Spend, f.Money.OnDemand)
			}
		}
		fmt.Fprintf(&b, `<text x="4" y="%d">%s</text>`+"\n", y+svgLane/2+2, esc(cut(br.name, svgNameChars)))
		wasted := f.LostHours + f.RestoreHours + (f.BetweenHours - gapHours(f))
		productive := f.WallHours * f.Goodput
		blocked := max(f.MachineHours-productive-wasted, 0)
		end := segs(y, scaleH, []float64{productive, blocked, wasted, gapHours(f)},
			[]string{colorGood, colorBlock, colorWaste, colorGap}, "hours")
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.1f h</text>`+"\n", end+6, y+svgLane/2+2, f.WallHours)
		if m := f.Money; priced && m != nil {
			y += svgLane
			end := segs(y, scaleM, []float64{m.Spend - m.Wasted, m.Wasted}, []string{colorGood, colorWaste}, "money")
			if m.OnDemand > 0 && scaleM > 0 {
				fmt.Fprintf(&b, `<rect class="on-demand" x="%d" y="%d" width="%.1f" height="%d" fill="none" stroke="#212121" stroke-dasharray="4 2"/>`+"\n",
					svgLeft, y, plotW*m.OnDemand/scaleM, svgLane-8)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">spend %.2f, wasted %.2f, on demand %.2f</text>`+"\n", max(end, svgLeft+plotW*m.OnDemand/max(scaleM, 1e-9))+6, y+svgLane/2+2, m.Spend, m.Wasted, m.OnDemand)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// dot is a legend's coloured mark: SVG text takes its fill, not the colour
// its name says, unless the mark has its own.
func dot(color string) string { return `<tspan fill="` + color + `">●</tspan>` }

// gapHours is the time without a machine: wall − machine.
func gapHours(f *Figures) float64 { return max(f.WallHours-f.MachineHours, 0) }
