package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/fleet"
)

// cmdFleet is `spotagent fleet`: every run under a store prefix
// (pkg/fleet, docs/fleet.md). It only parses flags.
func cmdFleet(args []string) int {
	var (
		format, since, runIDs, priceFile string
		recount, save                    bool
		prices                           fleet.Prices
	)
	more := func(fs *flag.FlagSet) {
		fs.StringVar(&format, "format", "table", "table, json, csv or html")
		fs.StringVar(&since, "since", "", "only runs active in this last period: 30d, 36h (default: every run)")
		fs.StringVar(&runIDs, "run-id", "", "only runs whose id matches one of these comma-separated globs (train-*,eval-?)")
		fs.BoolVar(&recount, "recount", false, "read every run journal instead of the fleet summary")
		fs.BoolVar(&save, "save-summary", false, "with --recount: write the recount back as the fleet summary (done anyway, best effort, when the summary is missing or not complete)")
		fs.StringVar(&priceFile, "prices", "", "price file: lines of instance_type,spot_per_hour,on_demand_per_hour")
		fs.Float64Var(&prices.Default.Spot, "price-per-hour", 0, "spot price per machine hour for instance types not in --prices")
		fs.Float64Var(&prices.Default.OnDemand, "on-demand-price-per-hour", 0, "on-demand price per machine hour for instance types not in --prices")
	}
	return storeCommand("fleet", args, more, func(ctx context.Context, st cloud.Store, _ *zap.Logger) error {
		if !slices.Contains(fleet.Formats, format) {
			return fmt.Errorf("--format %q: want table, json, csv or html", format)
		}
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
		if l.SaveErr != nil {
			fmt.Fprintf(os.Stderr, "spotagent fleet: warning: the recount was not saved as the fleet summary (the next run recounts again): %v\n", l.SaveErr)
		}
		damaged := l.Damaged
		rep, err := fleet.Build(l.Summary, o, l.Source, damaged)
		if err != nil {
			return err
		}
		if err := fleet.Write(os.Stdout, rep, format); err != nil {
			return err
		}
		if len(damaged) > 0 {
			return fmt.Errorf("%d damaged journal(s) (named above); the rest is counted", len(damaged))
		}
		return nil
	})
}
