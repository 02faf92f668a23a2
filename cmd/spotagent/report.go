package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/simulate"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

func newReportCmd() *cobra.Command {
	var o readOptions
	var format, interval string
	var price, onDemand float64
	var ac simulate.AdviceConfig
	cmd := &cobra.Command{
		Use:     "report",
		Short:   "goodput of a run: where its wall time (and money) went",
		Example: "spotagent report --store s3://my-bucket/runs/exp1 --price-per-hour 1.2",
		Args:    cobra.NoArgs,
	}
	check := func() error {
		if format != "table" && format != "json" {
			return badUsage("--format %q: want table or json", format)
		}
		var err error
		if ac.Current, err = parseInterval(interval); err != nil {
			return usageError{err}
		}
		if err := checkSchedule(ac.Min, ac.Max, ac.PriorRate, ac.Margin); err != nil {
			return usageError{err}
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"--price-per-hour", price}, {"--on-demand-price-per-hour", onDemand}} {
			if err := nonNegative(f.name, f.v); err != nil {
				return usageError{err}
			}
		}
		if ac.Runs < 0 {
			return badUsage("--advice-runs %d: want a number >= 0", ac.Runs)
		}
		if ac.Horizon <= 0 {
			return badUsage("--advice-horizon %s: want a positive duration", ac.Horizon)
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return o.run(cmd, check, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
			j, damage, err := checkpoint.ReadJournalSalvage(ctx, st)
			if errors.Is(err, cloud.ErrNotExist) {
				return fmt.Errorf("no run journal in %s", st.URI(""))
			}
			if err != nil {
				return err
			}
			g, err := checkpoint.Account(j, time.Now())
			if err != nil {
				if len(damage) > 0 {
					return fmt.Errorf("%s in %s is damaged and %w: %s", checkpoint.JournalKey, st.URI(""), err, strings.Join(damage, "; "))
				}
				return fmt.Errorf("no run journal in %s: %w", st.URI(""), err)
			}
			for _, d := range damage {
				g.Missing = append(g.Missing, "damaged journal: "+d)
			}
			var adv *simulate.Advice
			if ac.Runs > 0 {
				adv = simulate.Advise(j, g, ac)
			}
			promise := reportPromise(j, ac.Margin)
			note := ""
			if adv != nil && !cmd.Flags().Changed("interval") {
				note = noteIntervalDefault
			}
			if err := writeReport(cmd.OutOrStdout(), j, g, adv, note, promise, price, onDemand, format); err != nil {
				return err
			}
			if len(damage) > 0 {
				// The report above is what could be read; the exit status says
				// that it is partial.
				return fmt.Errorf("%s is damaged: %s", checkpoint.JournalKey, strings.Join(damage, "; "))
			}
			return nil
		})
	}
	o.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&format, "format", "table", "table or json")
	fs.Float64Var(&price, "price-per-hour", 0, "machine price per hour: adds spend and spend wasted by interruptions")
	fs.Float64Var(&onDemand, "on-demand-price-per-hour", 0, "on-demand price per hour: adds the saving against on-demand")
	fs.StringVar(&interval, "interval", "auto", "advice: the --interval the run used (auto or a duration; the journal does not record it)")
	fs.DurationVar(&ac.Margin, "margin", schedule.DefaultMargin, "advice: the run's current --margin")
	fs.DurationVar(&ac.Min, "min-interval", schedule.DefaultMinInterval, "advice: the run's --min-interval")
	fs.DurationVar(&ac.Max, "max-interval", schedule.DefaultMaxInterval, "advice: the run's --max-interval")
	fs.Float64Var(&ac.PriorRate, "interruption-rate", schedule.DefaultInterruptionRate, "advice: the run's --interruption-rate")
	fs.IntVar(&ac.Runs, "advice-runs", 100, "advice: simulated runs per candidate policy; 0 = no advice")
	fs.DurationVar(&ac.Horizon, "advice-horizon", 7*24*time.Hour, "advice: length of one simulated run")
	inGroup(fs, groupAdvice, "interval", "margin", "min-interval", "max-interval", "interruption-rate", "advice-runs", "advice-horizon")
	inGroup(fs, groupOutput, "format")
	completeWords(cmd, "format", "table", "json")
	return cmd
}

type reportJSON struct {
	*checkpoint.Goodput
	Money  *checkpoint.Money `json:"money,omitempty"`
	Advice *simulate.Advice  `json:"advice,omitempty"`
	// NoticePromise: whether a notice checkpoint of the newest measured
	// size commits within each cloud's notice (--margin kept).
	NoticePromise *promise.Status `json:"notice_promise,omitempty"`
	// AdviceNote: what the advice's "current" policy is, when report
	// could not know the run's own (noteIntervalDefault).
	AdviceNote string `json:"advice_note,omitempty"`
}

// noteIntervalDefault: the journal does not record the --interval a run
// used, so the advice's "current" policy is report's own --interval, auto
// unless given; the report says so rather than call it the run's.
const noteIntervalDefault = "the run's journal does not record its --interval: \"report's --interval\" above is report's default, auto; pass report --interval as the run had it"

// writeReport prints the goodput g of the run journal j.
func writeReport(w io.Writer, j *checkpoint.Journal, g *checkpoint.Goodput, adv *simulate.Advice, note string, promise *promise.Status, price, onDemand float64, format string) error {
	var m *checkpoint.Money
	if price > 0 {
		c := g.Cost(price, onDemand)
		m = &c
	}
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(reportJSON{g, m, adv, promise, note})
	}
	secs := func(s float64) string { return seconds(s).Round(time.Second).String() }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "SESSION\tSTART\tINSTANCE\tWALL")
	for _, b := range checkpoint.Buckets {
		fmt.Fprintf(tw, "\t%s", upper(b))
	}
	fmt.Fprintln(tw, "\tGOODPUT\tENDED BY\t")
	for _, s := range g.Sessions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s", s.Index, s.Start.Local().Format(time.DateTime), orDash(s.Instance), secs(s.Wall))
		for _, b := range checkpoint.Buckets {
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
	for _, b := range checkpoint.Buckets {
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
			secs(g.Seconds[checkpoint.BucketLost]+g.Seconds[checkpoint.BucketRestore]+g.Seconds[checkpoint.BucketBetween]),
			secs(g.Seconds[checkpoint.BucketLost]), secs(g.Seconds[checkpoint.BucketRestore]), secs(g.Seconds[checkpoint.BucketBetween]))
	}
	writeRestoreSources(w, j.Restores)
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
	if promise != nil {
		fmt.Fprintf(w, "on a notice: %s\n", describePromise(promise))
		if promise.Problem != "" {
			fmt.Fprintf(w, "  too slow: %s\n", promise.Problem)
			for _, a := range promise.Advice {
				fmt.Fprintf(w, "  advice: %s\n", a)
			}
		}
	}
	if adv != nil {
		writeAdvice(w, adv, note)
	}
	return nil
}

func writeAdvice(w io.Writer, a *simulate.Advice, note string) {
	c := a.Calibration
	fmt.Fprintf(w, "\nadvice: %d simulated run(s) of %s, calibrated on this run: %d interruption(s) in %s on machines (%.3g/h observed; posterior %.3g/h), %d with the notice checkpoint committed (posterior notice success %.2f), δ %.3g s, upload %.3g s, restart %.3g s\n",
		a.Runs, seconds(a.HorizonSeconds), c.Interruptions, time.Duration(c.RunHours*float64(time.Hour)).Round(time.Second), c.ObservedRate, c.Rate,
		c.NoticeCommitted, c.NoticeSuccess, c.DeltaSeconds, c.UploadSeconds, c.RestartSeconds)
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
	fmt.Fprintf(w, "recommended: --interval %s --margin %s: predicted waste %.3f %% of useful time, report's --interval and --margin %.3f %% (difference %.3f ± %.3f)\n",
		a.RecommendedFlag, seconds(a.Margin.Recommended), a.Waste, a.CurrentWaste,
		a.CurrentWaste-a.Waste, a.DiffSE)
	fmt.Fprintf(w, "margin (not simulated): %s\n", a.Margin.Basis)
	if note != "" {
		fmt.Fprintf(w, "note: %s\n", note)
	}
}

// endedBy says how a session that no interruption ended ended: finished
// (with its exit code when not 0), or still running, or with no end
// recorded (an agent killed outright).
func endedBy(j *checkpoint.Journal, s checkpoint.GoodputSession) string {
	if j == nil || s.Index < 1 || s.Index > len(j.Sessions) {
		return "-"
	}
	js := j.Sessions[s.Index-1]
	switch {
	case js.End != nil && js.ExitCode != nil && *js.ExitCode != 0:
		return fmt.Sprintf("finished (exit %d)", *js.ExitCode)
	case js.End != nil:
		return "finished"
	case s.Index == len(j.Sessions):
		return "running (no end recorded)"
	}
	return "no end recorded (agent killed?)"
}

// seconds converts a journal's or the advice's float seconds.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 32
		}
	}
	return string(b)
}

// reportPromise judges the journal's newest checkpoint against each
// cloud's notice: the run's own cloud is the newest session's.
func reportPromise(j *checkpoint.Journal, margin time.Duration) *promise.Status {
	own := schedule.CloudNotice{Cloud: "signal", Name: "a shutdown (--term-grace)", Lead: 25 * time.Second}
	if n := len(j.Sessions); n > 0 {
		if c, ok := schedule.NoticeFor(j.Sessions[n-1].Instance.Cloud); ok {
			own = c
		}
	}
	return promise.Describe(promise.FromJournal(j), own, margin)
}

// writeRestoreSources says where the run's restores read their bytes
// (#38): how many came from each source, and the bytes from each.
func writeRestoreSources(w io.Writer, rs []checkpoint.RestoreEntry) {
	count, bytes := map[string]int{}, map[string]int64{}
	for _, r := range rs {
		if r.From == nil {
			continue // a journal from before sources were recorded
		}
		count[orDash(r.Sources())]++
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
