package render

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/simulate"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

// reportJSON is `report --format json`: the goodput with its money, advice
// and notice promise.
type reportJSON struct {
	*journal.Goodput
	Money  *journal.Money   `json:"money,omitempty"`
	Advice *simulate.Advice `json:"advice,omitempty"`
	// NoticePromise: whether a notice checkpoint of the newest measured
	// size commits within each cloud's notice (--margin kept).
	NoticePromise *promise.Status `json:"notice_promise,omitempty"`
	// AdviceNote: what the advice's "current" policy is, when report
	// could not know the run's own (NoteIntervalDefault).
	AdviceNote string `json:"advice_note,omitempty"`
}

// NoteIntervalDefault: the journal does not record the --interval a run
// used, so the advice's "current" policy is report's own --interval, auto
// unless given; the report says so rather than call it the run's.
const NoteIntervalDefault = "the run's journal does not record its --interval: \"report's --interval\" above is report's default, auto; pass report --interval as the run had it"

// Report prints the goodput g of the run journal j.
func Report(w io.Writer, j *journal.Journal, g *journal.Goodput, adv *simulate.Advice, note string, np *promise.Status, price, onDemand float64, format string) error {
	var m *journal.Money
	if price > 0 {
		c := g.Cost(price, onDemand)
		m = &c
	}
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(reportJSON{g, m, adv, np, note})
	}
	secs := func(s float64) string { return Seconds(s).Round(time.Second).String() }
	// The unprotected column only when there was such time: most runs have none.
	buckets := journal.Buckets
	if g.Seconds[journal.BucketUnprotected] == 0 {
		buckets = slices.DeleteFunc(slices.Clone(buckets), func(b string) bool { return b == journal.BucketUnprotected })
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "SESSION\tSTART\tINSTANCE\tWALL")
	for _, b := range buckets {
		fmt.Fprintf(tw, "\t%s", Upper(b))
	}
	fmt.Fprintln(tw, "\tGOODPUT\tENDED BY\t")
	for _, s := range g.Sessions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s", s.Index, s.Start.Local().Format(time.DateTime), OrDash(s.Instance), secs(s.Wall))
		for _, b := range buckets {
			fmt.Fprintf(tw, "\t%s", secs(s.Seconds[b]))
		}
		ended := endedBy(j, s)
		if s.Interrupted {
			ended = "interruption (lost work)"
			if s.NoticeOK {
				ended = "interruption (notice checkpoint committed)"
			}
		}
		fmt.Fprintf(tw, "\t%.1f %%\t%s\t\n", 100*s.Ratio(), ended)
	}
	fmt.Fprintf(tw, "run\t%s\t\t%s", g.Start.Local().Format(time.DateTime), secs(g.Wall))
	for _, b := range buckets {
		fmt.Fprintf(tw, "\t%s", secs(g.Seconds[b]))
	}
	fmt.Fprintf(tw, "\t%.1f %%\t\t\n", 100*g.Ratio)
	tw.Flush()
	fmt.Fprintln(w)
	switch g.Interruptions {
	case 0:
		fmt.Fprintf(w, "goodput %.1f %% over %s in %d session(s); no interruptions\n", 100*g.Ratio, secs(g.Wall), len(g.Sessions))
	default:
		fmt.Fprintf(w, "goodput %.1f %% over %s in %d session(s); %d interruption(s), %d with the notice checkpoint committed; interruptions cost %s (lost %s, restore %s, between machines %s)\n",
			100*g.Ratio, secs(g.Wall), len(g.Sessions), g.Interruptions, g.NoticeCommits,
			secs(g.Seconds[journal.BucketLost]+g.Seconds[journal.BucketRestore]+g.Seconds[journal.BucketBetween]),
			secs(g.Seconds[journal.BucketLost]), secs(g.Seconds[journal.BucketRestore]), secs(g.Seconds[journal.BucketBetween]))
	}
	if u := g.Seconds[journal.BucketUnprotected]; u > 0 {
		fmt.Fprintf(w, "unprotected %s: the trainer ran without a connection to the agent, so nothing could be checkpointed (SPOTAGENT_SOCKET; docs/operations.md)\n", secs(u))
	}
	RestoreSources(w, j.Restores)
	if m != nil {
		fmt.Fprintf(w, "spend %.2f at %.4g/h, of which %.2f wasted by interruptions", m.Spend, m.PricePerHour, m.Wasted)
		if m.OnDemand > 0 {
			fmt.Fprintf(w, "; on demand %.2f, saving %.2f (%.0f %%)", m.OnDemand, m.Saving, 100*m.Saving/m.OnDemand)
		}
		fmt.Fprintln(w)
	}
	for _, s := range g.Missing {
		fmt.Fprintln(w, "incomplete journal:", s)
	}
	if np != nil {
		fmt.Fprintf(w, "on a notice: %s\n", Promise(np))
		if np.Problem != "" {
			fmt.Fprintf(w, "  too slow: %s\n", np.Problem)
			for _, a := range np.Advice {
				fmt.Fprintf(w, "  advice: %s\n", a)
			}
		}
	}
	if adv != nil {
		advice(w, adv, note)
	}
	return nil
}

// advice prints the simulated policies and the recommended one.
func advice(w io.Writer, a *simulate.Advice, note string) {
	c := a.Calibration
	// Plain words; the statistics behind "assumed" (posterior means) and
	// "blocks the trainer" (δ) are in docs/frequency.md.
	fmt.Fprintf(w, "\nadvice: %d simulated run(s) of %s, fitted to this run: %d interruption(s) in %s on machines (%.3g/h seen; %.3g/h assumed: the usual rate, moved by what this run saw), %d of them with the notice checkpoint committed (%.0f %% assumed to commit); a checkpoint blocks the trainer %.3g s and uploads in %.3g s; a restart takes %.3g s\n",
		a.Runs, Seconds(a.HorizonSeconds), c.Interruptions, time.Duration(c.RunHours*float64(time.Hour)).Round(time.Second), c.ObservedRate, c.Rate,
		c.NoticeCommitted, 100*c.NoticeSuccess, c.DeltaSeconds, c.UploadSeconds, c.RestartSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tPREDICTED WASTE\tPREDICTED GOODPUT\t")
	for _, p := range a.Policies {
		mark := ""
		if p.Current {
			mark += " (report's --interval)"
		}
		if p.Policy == a.Recommended {
			mark += " (recommended)"
		}
		fmt.Fprintf(tw, "--interval %s%s\t%.3f %%\t%.2f %%\t\n", p.Flag, mark, p.Waste, 100*p.Goodput)
	}
	tw.Flush()
	fmt.Fprintf(w, "recommended: --interval %s --margin %s: predicted waste %.3f %% of useful time, report's --interval and --margin %.3f %% (%.3f points more, give or take %.3f)\n",
		a.RecommendedFlag, Seconds(a.Margin.Recommended), a.Waste, a.CurrentWaste,
		a.CurrentWaste-a.Waste, a.DiffSE)
	fmt.Fprintf(w, "margin (not simulated): %s\n", a.Margin.Basis)
	if note != "" {
		fmt.Fprintf(w, "note: %s\n", note)
	}
}

// endedBy says how a session that no interruption ended ended: finished,
// its trainer failing (a crash is no finish: #47), or still running, or
// with no end recorded (an agent killed outright).
func endedBy(j *journal.Journal, s journal.GoodputSession) string {
	if j == nil || s.Index < 1 || s.Index > len(j.Sessions) {
		return "-"
	}
	js := j.Sessions[s.Index-1]
	switch {
	case js.End != nil && js.ExitCode != nil && *js.ExitCode != 0:
		return fmt.Sprintf("trainer failed (exit %d)", *js.ExitCode)
	case js.End != nil:
		return "finished"
	case s.Index == len(j.Sessions):
		return "running (no end recorded)"
	}
	return "no end recorded (agent killed?)"
}

// RestoreSources says where the run's restores read their bytes
// (#38): how many came from each source, and the bytes from each.
func RestoreSources(w io.Writer, rs []journal.RestoreEntry) {
	count, bytes := map[string]int{}, map[string]int64{}
	for _, r := range rs {
		if r.From == nil {
			continue // a journal from before sources were recorded
		}
		count[OrDash(r.Sources())]++
		for s, n := range r.From {
			bytes[s] += n
		}
	}
	if len(count) == 0 {
		return
	}
	var by, read []string
	for _, s := range slices.Sorted(maps.Keys(count)) {
		by = append(by, fmt.Sprintf("%d from %s", count[s], s))
	}
	for _, s := range slices.Sorted(maps.Keys(bytes)) {
		read = append(read, fmt.Sprintf("%s from %s", schedule.HumanBytes(bytes[s]), s))
	}
	fmt.Fprintf(w, "restores: %s; read %s\n", strings.Join(by, ", "), strings.Join(read, ", "))
}
