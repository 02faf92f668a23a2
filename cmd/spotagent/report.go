package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/simulate"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"

	"github.com/spotagent/spotagent/internal/render"
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
			j, damage, err := journal.ReadSalvage(ctx, st)
			if errors.Is(err, cloud.ErrNotExist) {
				return fmt.Errorf("no run journal in %s", st.URI(""))
			}
			if err != nil {
				return err
			}
			g, err := journal.Account(j, time.Now())
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
				c := ac
				c.Margin = zeroAsNone(ac.Margin)
				adv = simulate.Advise(j, g, c)
			}
			promise := reportPromise(j, ac.Margin)
			note := ""
			if adv != nil && !cmd.Flags().Changed("interval") {
				note = render.NoteIntervalDefault
			}
			if err := render.Report(cmd.OutOrStdout(), j, g, adv, note, promise, price, onDemand, format); err != nil {
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

// reportPromise judges the journal's newest checkpoint against each
// cloud's notice: the run's own cloud is the newest session's.
func reportPromise(j *journal.Journal, margin time.Duration) *promise.Status {
	own := schedule.CloudNotice{Cloud: "signal", Name: "a shutdown (--term-grace)", Lead: 25 * time.Second}
	if n := len(j.Sessions); n > 0 {
		if c, ok := schedule.NoticeFor(j.Sessions[n-1].Instance.Cloud); ok {
			own = c
		}
	}
	return promise.Describe(promise.FromJournal(j), own, margin)
}
