package benchstore

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// Commit commits one directory to a store through pkg/checkpoint's
// Committer with the agent's defaults: the code path `spotagent run` takes
// for every checkpoint (scan, concurrent streamed upload with CRC32C,
// manifest, latest.json). It prints the result as one JSON line.
// SPOTBENCH_CPUPROFILE=FILE writes a CPU profile of the commit (pprof).
func Commit(args []string) int {
	fs := flag.NewFlagSet("commit", flag.ExitOnError)
	uri := fs.String("store", "", "store URI")
	dir := fs.String("dir", "", "checkpoint directory")
	fs.Parse(args)
	ctx := context.Background()
	if p := os.Getenv("SPOTBENCH_CPUPROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "commit:", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "commit:", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	st, err := all.Open(ctx, *uri, all.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "commit:", err)
		return 1
	}
	defer st.Close()
	c := &checkpoint.Committer{Store: st, RunID: "bench"}
	start := time.Now()
	res, err := c.Commit(ctx, checkpoint.Request{Dir: *dir, ID: "bench", Step: 1, Reason: "periodic"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "commit:", err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"bytes": res.Bytes, "upload_s": res.Upload.Seconds(), "total_s": res.Total.Seconds(),
		"wall_s": time.Since(start).Seconds(), "manifest": res.ManifestKey,
	})
	return 0
}
