package fleet

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Formats are what Write writes.
var Formats = []string{"table", "wide", "json", "csv", "html"}

// TableWidth is the most columns the default table takes with ordinary
// values (cloud names, instance types, zones, run ids up to runIDWidth):
// it fits a 120-column terminal. "wide" has every column.
const TableWidth = 120

// runIDWidth is where the default table cuts a run id (with "…"); "wide"
// and the other formats show it whole.
const runIDWidth = 20

// Write writes rep in format: table, wide, json, csv or html.
func Write(w io.Writer, rep *Report, format string) error {
	switch format {
	case "table":
		return writeTable(w, rep, false)
	case "wide":
		return writeTable(w, rep, true)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case "csv":
		return writeCSV(w, rep)
	case "html":
		return writeHTML(w, rep)
	}
	return fmt.Errorf("format %q: want table, wide, json, csv or html", format)
}

// column is one figure as the table and the CSV show it. short is its
// head in the default table; "" leaves it to the wide table.
type column struct {
	head  string
	money bool
	table func(f *Figures) string
	short string
}

// perCellOnly are the columns the per-run table leaves out: a run is one
// run.
var perCellOnly = map[string]bool{"RUNS": true}

func num(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// sig writes v to three significant digits, never in exponent form: a
// rate of 100.0844/h reads 100, 5.1337 reads 5.13, 0.012345 reads 0.0123.
func sig(v float64) string {
	if v == 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return num(v, 0)
	}
	return num(v, min(6, max(0, 2-int(math.Floor(math.Log10(math.Abs(v)))))))
}

func optNum(v *float64, prec int) string {
	if v == nil {
		return ""
	}
	return num(*v, prec)
}

func dur(v *float64) string {
	if v == nil {
		return "-"
	}
	return time.Duration(*v * float64(time.Second)).Round(time.Second).String()
}

func money(f *Figures, get func(m *Money) float64) string {
	if f.Money == nil {
		return ""
	}
	return num(get(f.Money), 2)
}

var columns = []column{
	{"RUNS", false, func(f *Figures) string { return strconv.Itoa(f.Runs) }, "RUNS"},
	{"MACHINE H", false, func(f *Figures) string { return num(f.MachineHours, 1) }, "HOURS"},
	{"INTERRUPTIONS", false, func(f *Figures) string { return strconv.Itoa(f.Interruptions) }, "INTR"},
	{"RATE/H (90 %)", false, func(f *Figures) string {
		if f.Rate == nil {
			return "-"
		}
		return sig(*f.Rate) + " (" + sig(*f.RateLow) + "–" + sig(*f.RateHigh) + ")"
	}, ""},
	{"RATE/H", false, func(f *Figures) string {
		if f.Rate == nil {
			return "-"
		}
		return sig(*f.Rate)
	}, "RATE/H"}, // the default table's rate, without its interval
	{"NOTICE COMMITTED", false, func(f *Figures) string {
		if f.Interruptions == 0 {
			return "-"
		}
		return fmt.Sprintf("%d/%d", f.NoticeCommits, f.Interruptions)
	}, "NOTICE"},
	{"NOTICE LEAD MEDIAN/SHORTEST", false, func(f *Figures) string {
		if f.LeadMedian == nil {
			return "-"
		}
		return dur(f.LeadMedian) + "/" + dur(f.LeadMin)
	}, ""},
	{"LOST H", false, func(f *Figures) string { return num(f.LostHours, 2) }, "LOST H"},
	{"BETWEEN/INTERRUPTION", false, func(f *Figures) string { return dur(f.BetweenPerInterruption) }, ""},
	{restoredHead, false, func(f *Figures) string { return restoredFrom(f, " ") }, ""},
	{"GOODPUT", false, func(f *Figures) string { return num(100*f.Goodput, 1) + " %" }, "GOODPUT"},
	{"SPEND", true, func(f *Figures) string { return money(f, func(m *Money) float64 { return m.Spend }) }, "SPEND"},
	{"WASTED", true, func(f *Figures) string { return money(f, func(m *Money) float64 { return m.Wasted }) }, "WASTED"},
	{"SAVING", true, func(f *Figures) string { return money(f, func(m *Money) float64 { return m.Saving }) }, ""},
	{"PER 1K STEPS", true, func(f *Figures) string {
		if f.Money == nil || f.Money.CostPer1kSteps == nil {
			return "-"
		}
		return sig(*f.Money.CostPer1kSteps)
	}, ""},
	{"30D FORECAST", true, func(f *Figures) string { return money(f, func(m *Money) float64 { return m.Forecast30d }) }, ""},
}

// shown reports whether the table shows c, and under which head.
func (c column) shown(wide, priced bool) (string, bool) {
	if c.money && !priced {
		return "", false
	}
	if wide {
		return c.head, c.head != "RATE/H" // the wide table has the rate with its interval
	}
	return c.short, c.short != ""
}

// cut shortens s to n runes, ending in "…".
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// writeTable writes the terminal table: by default the figures that fit
// TableWidth columns, wide every column.
func writeTable(w io.Writer, rep *Report, wide bool) error {
	priced := rep.Total.Money != nil
	perRun := false // the second table's rows are runs
	row := func(tw io.Writer, lead string, f *Figures) {
		fmt.Fprint(tw, lead)
		for _, c := range columns {
			if _, ok := c.shown(wide, priced); ok && !(perRun && perCellOnly[c.head]) {
				fmt.Fprintf(tw, "\t%s", c.table(f))
			}
		}
		fmt.Fprintln(tw)
	}
	head := func(tw io.Writer, lead string) {
		fmt.Fprint(tw, lead)
		for _, c := range columns {
			if h, ok := c.shown(wide, priced); ok && !(perRun && perCellOnly[c.head]) {
				fmt.Fprintf(tw, "\t%s", h)
			}
		}
		fmt.Fprintln(tw)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if wide {
		head(tw, "CLOUD\tINSTANCE TYPE\tZONE")
	} else {
		head(tw, "CLOUD\tINSTANCE\tZONE")
	}
	for i := range rep.Cells {
		c := &rep.Cells[i]
		row(tw, orDash(c.Cloud)+"\t"+orDash(c.InstanceType)+"\t"+orDash(c.Zone), &c.Figures)
	}
	row(tw, "fleet\t\t", &rep.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	perRun = true
	if wide {
		head(tw, "RUN\tSTART\tEND")
	} else {
		head(tw, "RUN\tSTART (UTC)")
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if wide {
			row(tw, r.ID+"\t"+r.Start.UTC().Format(time.DateTime)+"\t"+r.End.UTC().Format(time.DateTime), &r.Figures)
		} else {
			row(tw, cut(r.ID, runIDWidth)+"\t"+r.Start.UTC().Format("2006-01-02 15:04"), &r.Figures)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	t := &rep.Total
	fmt.Fprintf(w, "fleet (%s): %d run(s), %.1f machine hours, %d interruption(s)", rep.Source, t.Runs, t.MachineHours, t.Interruptions)
	if t.Rate != nil {
		fmt.Fprintf(w, ", %s/h (90 %% interval %s–%s)", sig(*t.Rate), sig(*t.RateLow), sig(*t.RateHigh))
	}
	fmt.Fprintf(w, ",\n%d with the notice checkpoint committed, %.2f h of work lost, goodput %.1f %%\n",
		t.NoticeCommits, t.LostHours, 100*t.Goodput)
	if t.Restores > 0 {
		fmt.Fprintf(w, "%d restore(s)", t.Restores)
		if len(t.RestoredBytes) > 0 {
			fmt.Fprintf(w, ", read from %s", restoredFrom(t, ", "))
		}
		fmt.Fprintln(w)
	}
	if m := t.Money; m != nil {
		fmt.Fprintf(w, "spend %.2f, of which %.2f wasted by interruptions; on demand %.2f, saving %.2f", m.Spend, m.Wasted, m.OnDemand, m.Saving)
		if m.CostPer1kSteps != nil {
			fmt.Fprintf(w, ";\n%s per 1,000 steps", sig(*m.CostPer1kSteps))
		}
		fmt.Fprintf(w, "\nforecast for the next %d days at the usage of the last %.1f day(s): spend %.2f, saving %.2f\n",
			forecastDays, rep.WindowDays, m.Forecast30d, m.ForecastSaving30d)
		if m.UnpricedHours > 0 {
			fmt.Fprintf(w, "%.1f machine hours have no price (instance types missing from the price file): not in spend\n", m.UnpricedHours)
		}
	}
	for _, d := range rep.Damaged {
		state := "not counted"
		if d.Counted {
			state = "the rest counted"
		}
		fmt.Fprintf(w, "damaged journal %s (%s):\n", d.Key, state)
		for _, p := range d.Problems { // one a line: the table stays narrow
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	return nil
}

var csvHead = []string{"scope", "cloud", "instance_type", "zone", "run", "start", "end",
	"runs", "machine_hours", "wall_hours", "interruptions", "rate_per_hour", "rate_low", "rate_high",
	"notice_commits", "lead_median_s", "lead_min_s", "lost_hours", "lost_steps", "between_hours",
	"between_per_interruption_s", "restore_hours", "goodput", "steps",
	"spend", "wasted", "on_demand", "saving", "cost_per_1k_steps", "forecast_30d", "forecast_saving_30d",
	"restores", "restored_local_bytes", "restored_peer_bytes", "restored_store_bytes"}

// restoredHead heads the column of where restores read from.
const restoredHead = "RESTORED FROM"

// sourceOrder is where restores read from, nearest first.
var sourceOrder = []string{checkpoint.FromLocal, checkpoint.FromPeer, checkpoint.FromStore}

// restoredFrom says how many bytes the restores read from each source,
// nearest first ("local 2.0 GiB, peer 1.0 GiB, store 0 B" with sep ", ");
// "-" when none is known.
func restoredFrom(f *Figures, sep string) string {
	srcs := slices.Clone(sourceOrder)
	for _, src := range slices.Sorted(maps.Keys(f.RestoredBytes)) {
		if !slices.Contains(srcs, src) {
			srcs = append(srcs, src) // from a newer agent: shown, last
		}
	}
	var out []string
	for _, src := range srcs {
		if n, ok := f.RestoredBytes[src]; ok {
			out = append(out, src+" "+schedule.HumanBytes(n))
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, sep)
}

func csvRow(scope string, k Key, run string, start, end time.Time, f *Figures) []string {
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	}
	r := []string{scope, k.Cloud, k.InstanceType, k.Zone, run, ts(start), ts(end),
		strconv.Itoa(f.Runs), num(f.MachineHours, 4), num(f.WallHours, 4), strconv.Itoa(f.Interruptions),
		optNum(f.Rate, 6), optNum(f.RateLow, 6), optNum(f.RateHigh, 6), strconv.Itoa(f.NoticeCommits),
		optNum(f.LeadMedian, 1), optNum(f.LeadMin, 1), num(f.LostHours, 4), strconv.FormatInt(f.LostSteps, 10),
		num(f.BetweenHours, 4), optNum(f.BetweenPerInterruption, 1), num(f.RestoreHours, 4),
		num(f.Goodput, 4), num(f.Steps, 0)}
	if m := f.Money; m != nil {
		r = append(r, num(m.Spend, 4), num(m.Wasted, 4), num(m.OnDemand, 4), num(m.Saving, 4),
			optNum(m.CostPer1kSteps, 6), num(m.Forecast30d, 4), num(m.ForecastSaving30d, 4))
	} else {
		r = append(r, "", "", "", "", "", "", "")
	}
	r = append(r, strconv.Itoa(f.Restores))
	for _, src := range sourceOrder {
		r = append(r, strconv.FormatInt(f.RestoredBytes[src], 10))
	}
	return r
}

func writeCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHead)
	for i := range rep.Cells {
		c := &rep.Cells[i]
		cw.Write(csvRow("cell", c.Key, "", time.Time{}, time.Time{}, &c.Figures))
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		cw.Write(csvRow("run", Key{}, r.ID, r.Start, r.End, &r.Figures))
	}
	cw.Write(csvRow("fleet", Key{}, "", time.Time{}, time.Time{}, &rep.Total))
	cw.Flush()
	return cw.Error()
}
