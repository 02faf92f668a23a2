package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/fleet"
)

// Issue 36 item 4: `run --store file:///DIR/store` creates nothing beside
// its store (once it wrote DIR/fleet-summary.json and DIR/.spotagent-lock):
// its fleet record goes into the run's own store, where `spotagent fleet
// --store` finds it; with --fleet it goes where that names, and `fleet`
// over it shows the run.
func TestRun_FleetRecordStaysInNamedStores(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, c := range []struct {
		name   string
		fleet  string // --fleet, under dir ("" none)
		report string // what `spotagent fleet --store` reads, under dir
		beside []string
	}{
		{"own store", "", "runs/r1", []string{"ckpt", "runs", "runs/r1"}},
		{"--fleet", "runs", "runs", []string{"ckpt", "runs", "runs/fleet", "runs/r1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := shortTempDir(t)
			args := []string{"run", "--store", "file://" + filepath.Join(dir, "runs", "r1"), "--cloud", "none",
				"--socket", filepath.Join(dir, "a.sock"), "--checkpoint-dir", filepath.Join(dir, "ckpt")}
			if c.fleet != "" {
				args = append(args, "--fleet", "file://"+filepath.Join(dir, c.fleet))
			}
			// The trainer ends once the journal holds the session (a trainer
			// that exits at once may end before it is written).
			journal := filepath.Join(dir, "runs", "r1", "journal.json")
			trainer := "until grep -q '\"start\"' " + journal + " 2>/dev/null; do sleep 0.01; done"
			if code, out, errOut := cli(t, append(args, "--", "/bin/sh", "-c", trainer)...); code != 0 {
				t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
			}
			var names []string
			for _, sub := range []string{"", "runs"} {
				es, _ := os.ReadDir(filepath.Join(dir, sub))
				for _, e := range es {
					names = append(names, filepath.Join(sub, e.Name()))
				}
			}
			slices.Sort(names)
			if !slices.Equal(names, c.beside) {
				t.Errorf("beside the store: %v, want %v", names, c.beside)
			}
			before := storeTree(t, dir)
			code, out, errOut := cli(t, "fleet", "--store", filepath.Join(dir, c.report), "--format", "json")
			if code != 0 || strings.Contains(errOut, "warning") {
				t.Fatalf("fleet: exit %d\n%s%s", code, out, errOut)
			}
			var rep fleet.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if len(rep.Runs) != 1 || rep.Runs[0].ID != "r1" {
				t.Errorf("fleet over %s: runs %+v, want r1", c.report, rep.Runs)
			}
			// A read writes nothing (#47: fleet wrote summary.gob on a
			// read); --save-summary writes the summary and says nothing.
			if got := storeTree(t, dir); !slices.Equal(got, before) {
				t.Errorf("fleet changed the store:\n%v\nwas\n%v", got, before)
			}
			if !strings.Contains(errOut, "--save-summary folds them in") {
				t.Errorf("fleet did not say the records are not saved:\n%s", errOut)
			}
			code, out, errOut = cli(t, "fleet", "--store", filepath.Join(dir, c.report), "--save-summary")
			if code != 0 || errOut != "" {
				t.Fatalf("fleet --save-summary: exit %d\n%s%s", code, out, errOut)
			}
			if _, err := os.Stat(filepath.Join(dir, c.report, "fleet", "summary.gob")); err != nil {
				t.Errorf("fleet --save-summary: %v", err)
			}
		})
	}
}

// storeTree lists every file under dir with its size and modification time.
func storeTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Type()&os.ModeSocket == 0 {
			out = append(out, fmt.Sprintf("%s %d %s", path, info.Size(), info.ModTime()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
