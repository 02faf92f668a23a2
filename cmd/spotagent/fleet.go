package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spf13/cobra"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/fleet"
)

// newFleetCmd is `spotagent fleet`: every run under a store prefix
// (pkg/fleet, docs/fleet.md). It only parses flags.
func newFleetCmd() *cobra.Command {
	var o readOptions
	var (
		format, since, runIDs, priceFile string
		recount, save                    bool
		prices                           fleet.Prices
	)
	cmd := &cobra.Command{
		Use:     "fleet",
		Short:   "every run of a fleet (the store agents name with --fleet): interruptions, lost work, goodput and money by cloud, instance type and zone",
		Example: "spotagent fleet --store s3://my-bucket/runs --since 30d --price-per-hour 1.2 --on-demand-price-per-hour 3.9",
		Args:    cobra.NoArgs,
	}
	check := func() error {
		if !slices.Contains(fleet.Formats, format) {
			return badUsage("--format %q: want table, wide, json, csv or html", format)
		}
		if _, err := fleet.ParseSince(since); err != nil {
			return usageError{err}
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"--price-per-hour", prices.Default.Spot}, {"--on-demand-price-per-hour", prices.Default.OnDemand}} {
			if err := nonNegative(f.name, f.v); err != nil {
				return usageError{err}
			}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return o.run(cmd, check, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
			o := fleet.Options{Now: time.Now(), Prices: prices}
			var err error
			if o.Since, err = fleet.ParseSince(since); err != nil {
				return err
			}
			for g := range strings.SplitSeq(runIDs, ",") {
				if g = strings.TrimSpace(g); g != "" {
					o.RunIDs = append(o.RunIDs, g)
				}
			}
			if priceFile != "" {
				f, err := os.Open(priceFile)
				if err != nil {
					return err
				}
				o.Prices.ByType, err = fleet.ReadPrices(f)
				f.Close()
				if err != nil {
					return err
				}
			}
			l, err := fleet.Load(ctx, st, recount, save, o.Now)
			if err != nil {
				return err
			}
			damaged := l.Damaged
			rep, err := fleet.Build(l.Summary, o, l.Source, damaged)
			if err != nil {
				return err
			}
			if err := fleet.Write(cmd.OutOrStdout(), rep, format); err != nil {
				return err
			}
			// A read writes nothing: the records read are folded into the
			// summary only when asked, after the report.
			switch {
			case save:
				if err := l.Compact(ctx); err != nil {
					return fmt.Errorf("the report is out, but the fleet summary was not saved: %w", err)
				}
			case l.Pending():
				fmt.Fprintln(cmd.ErrOrStderr(), "spotagent fleet: nothing written: the fleet summary is missing or behind the session records read; --save-summary folds them in (the next fleet and new runs' priors then read less)")
			}
			if len(damaged) > 0 {
				return fmt.Errorf("%d damaged journal(s) (named above); the rest is counted", len(damaged))
			}
			return nil
		})
	}
	o.register(cmd)
	fs := cmd.Flags()
	fs.Lookup("store").Usage = "the prefix the runs' stores are under (each run's store is PREFIX/RUN-ID): s3://bucket/prefix, gs://bucket/prefix, az://container[@account]/prefix, file:///dir or a path"
	fs.StringVar(&format, "format", "table", "table (fits 120 columns), wide (every column), json, csv or html")
	fs.StringVar(&since, "since", "", "only runs active in this last period: 30d, 36h (default: every run)")
	fs.StringVar(&runIDs, "run-id", "", "only runs whose id matches one of these comma-separated globs (train-*,eval-?); never taken from SPOTAGENT_RUN_ID, which the agent exports to its trainers")
	if err := fs.SetAnnotation("run-id", noEnvKey, []string{"1"}); err != nil {
		panic(err)
	}
	fs.BoolVar(&recount, "recount", false, "read every run journal under --store instead of the fleet summary and records (finds runs whose agents recorded elsewhere)")
	fs.BoolVar(&save, "save-summary", false, "after the report, write to the store: fold the session records into the fleet summary and the priors new runs read, or, with --recount, replace the summary with the recount (without it, fleet only reads)")
	fs.StringVar(&priceFile, "prices", "", "price file: lines of instance_type,spot_per_hour,on_demand_per_hour")
	fs.Float64Var(&prices.Default.Spot, "price-per-hour", 0, "spot price per machine hour for instance types not in --prices")
	fs.Float64Var(&prices.Default.OnDemand, "on-demand-price-per-hour", 0, "on-demand price per machine hour for instance types not in --prices")
	inGroup(fs, groupOutput, "format")
	completeWords(cmd, "format", fleet.Formats...)
	return cmd
}
