package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
	"github.com/spotagent/spotagent/pkg/fleet"
)

// stdout runs fn with os.Stdout captured.
func fleetCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := execute(append([]string{"fleet"}, args...), &out, &errOut)
	return code, out.String() + errOut.String()
}

// spotagent fleet over an S3 prefix (the in-process server, through the
// same URI and flags a user gives): the runs' journals written by the
// agent's journal writer, then the summary that --save-summary leaves.
func TestCmdFleet_S3(t *testing.T) {
	srv := s3test.New(t)
	ctx := context.Background()
	t0 := time.Now().Add(-48 * time.Hour).UTC()
	for i, id := range []string{"llm-1", "llm-2", "eval-1"} {
		st, err := s3.New(ctx, srv.Bucket, "teams/runs/"+id, s3.Options{})
		if err != nil {
			t.Fatal(err)
		}
		end := t0.Add(time.Duration(i+1) * time.Hour)
		w := journal.NewWriter(st, &journal.Journal{Format: journal.Format, RunID: id})
		err = w.Update(ctx, func(j *journal.Journal) {
			j.Sessions = append(j.Sessions, journal.Session{Start: t0, End: &end,
				Instance: checkpoint.Machine{Cloud: "aws", InstanceType: "p4d.24xlarge", Zone: "us-east-1a"}})
		})
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	uri := "s3://" + srv.Bucket + "/teams/runs"
	for _, c := range []struct {
		args   []string
		source string
		runs   int
		hours  float64
	}{
		{[]string{"--store", uri, "--format", "json", "--save-summary", "--price-per-hour", "10"}, "recount", 3, 6},
		{[]string{"--store", uri, "--format", "json", "--run-id", "llm-*"}, "summary", 2, 3},
	} {
		code, out := fleetCLI(t, c.args...)
		if code != 0 {
			t.Fatalf("spotagent fleet %v: exit %d\n%s", c.args, code, out)
		}
		var rep fleet.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		if rep.Source != c.source || rep.Total.Runs != c.runs || rep.Total.MachineHours < c.hours-1e-6 || rep.Total.MachineHours > c.hours+1e-6 {
			t.Errorf("%v: source %s, %d runs, %v h; want %s, %d, %v", c.args, rep.Source, rep.Total.Runs, rep.Total.MachineHours, c.source, c.runs, c.hours)
		}
	}
	// A shell under `spotagent run` inherits SPOTAGENT_RUN_ID: fleet still
	// counts every run (#41 item 3).
	t.Setenv("SPOTAGENT_RUN_ID", "eval-1")
	code, out := fleetCLI(t, "--store", uri, "--format", "json")
	var rep fleet.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Total.Runs != 3 {
		t.Errorf("SPOTAGENT_RUN_ID=eval-1 spotagent fleet: exit %d, %d runs (%v), want 0 and all 3:\n%s", code, rep.Total.Runs, err, out)
	}
	if code, _ := fleetCLI(t, "--store", uri, "--format", "xml"); code != 2 {
		t.Errorf("--format xml: exit %d, want 2 (bad usage)", code)
	}
}
