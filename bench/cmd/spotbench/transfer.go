package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/benchstore"
	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

type dataset struct {
	name, label string
	dir, cat    string // the checkpoint directory; the same bytes as one file
	bytes       int64
}

// makeDatasets writes the two checkpoints (random, incompressible bytes)
// and each one's concatenation for the single-stream ceiling.
func makeDatasets(c *config) ([]dataset, error) {
	specs := []struct {
		name, label string
		files       int
		size        int64
	}{
		{"1gib", "1 GiB (4 × 256 MiB)", 4, 256 << 20},
		{"small", "500 MiB (2,000 × 256 KiB)", 2000, 256 << 10},
	}
	var out []dataset
	rng := rand.NewChaCha8([32]byte{'s', 'p', 'o', 't'})
	buf := make([]byte, 1<<20)
	for _, s := range specs {
		d := dataset{name: s.name, label: s.label, dir: filepath.Join(c.work, "data", s.name), cat: filepath.Join(c.work, "data", s.name+".cat")}
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return nil, err
		}
		cat, err := os.Create(d.cat)
		if err != nil {
			return nil, err
		}
		for i := range s.files {
			f, err := os.Create(filepath.Join(d.dir, fmt.Sprintf("shard-%04d.bin", i)))
			if err != nil {
				return nil, err
			}
			for left := s.size; left > 0; {
				n := min(left, int64(len(buf)))
				rng.Read(buf[:n])
				if _, err := f.Write(buf[:n]); err != nil {
					return nil, err
				}
				if _, err := cat.Write(buf[:n]); err != nil {
					return nil, err
				}
				left -= n
			}
			if err := f.Close(); err != nil {
				return nil, err
			}
			d.bytes += s.size
		}
		if err := cat.Close(); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	exec.Command("sync").Run()
	return out, nil
}

type sample struct {
	mbps   []float64
	rss    []float64 // MiB
	cpu    []float64 // core-seconds, the tool's process (user + system)
	srvCPU []float64 // core-seconds, MinIO's meanwhile
}

type key struct{ store, ds, op, tool string }

// transferRun is one server's share of the transfer section.
type transferRun struct {
	name, label string
	suffix      string            // appended to its target names
	minio       *benchstore.MinIO // nil: fake-gcs-server
	sets        []dataset
	restore     bool
}

func transferRuns(s *benchstore.Stores, sets []dataset) []transferRun {
	var big []dataset
	for _, ds := range sets {
		if ds.name == "1gib" {
			big = append(big, ds)
		}
	}
	all := []transferRun{
		{name: "s3", label: "S3 (MinIO)", minio: s.MinIO, sets: sets, restore: true},
		// The 1 GiB upload only: MinIO's MD5 is an upload cost, and the
		// restore (GET) path is the same with or without it.
		{name: "s3-lean", label: "S3 (MinIO --no-compat)", suffix: ", MinIO --no-compat", minio: s.Lean, sets: big},
		{name: "gcs", label: "GCS (fake-gcs-server)", sets: sets, restore: true},
	}
	// SPOTBENCH_TRANSFER_STORES=s3,s3-lean,gcs picks some stores.
	if only := os.Getenv("SPOTBENCH_TRANSFER_STORES"); only != "" {
		var out []transferRun
		for _, tr := range all {
			if slices.Contains(strings.Split(only, ","), tr.name) {
				out = append(out, tr)
			}
		}
		return out
	}
	return all
}

// transferSets: SPOTBENCH_TRANSFER_SETS=1gib,small picks some data sets.
func transferSets(sets []dataset) []dataset {
	only := os.Getenv("SPOTBENCH_TRANSFER_SETS")
	if only == "" {
		return sets
	}
	var out []dataset
	for _, ds := range sets {
		if slices.Contains(strings.Split(only, ","), ds.name) {
			out = append(out, ds)
		}
	}
	return out
}

// A baseline, for figures side by side in one run: SPOTBENCH_BASELINE is
// a spotbench binary built from an older commit (its `commit` subcommand
// uploads), SPOTBENCH_BASELINE_BIN that commit's spotagent (restores).
// The baseline takes turns with the other tools as "spotagent (base)".
const baseTool = "spotagent (base)"

func baseline() (spotbench, agent string) {
	return os.Getenv("SPOTBENCH_BASELINE"), os.Getenv("SPOTBENCH_BASELINE_BIN")
}

// benchTransfer: upload then restore, per store and data set, N
// repetitions; within a repetition the tools take turns, in an order that
// rotates each repetition so that none always goes first.
func benchTransfer(c *config, r *report.Report, s *benchstore.Stores) error {
	logf("writing the data sets")
	sets, err := makeDatasets(c)
	if err != nil {
		return err
	}
	sets = transferSets(sets)
	baseBench, baseAgent := baseline()
	res := map[key]*sample{}
	add := func(k key, bytes int64, d time.Duration, rssKiB int64, cpu, srvCPU float64) {
		if res[k] == nil {
			res[k] = &sample{}
		}
		res[k].mbps = append(res[k].mbps, stats.MBps(bytes, d))
		res[k].rss = append(res[k].rss, float64(rssKiB)/1024)
		res[k].cpu = append(res[k].cpu, cpu)
		res[k].srvCPU = append(res[k].srvCPU, srvCPU)
		logf("%-7s %-6s %-8s %-10s %7.1f MB/s  %5.2fs  peak RSS %4d MiB  cpu %.2fs, server %.2fs", k.store, k.ds, k.op, k.tool,
			stats.MBps(bytes, d), d.Seconds(), rssKiB/1024, cpu, srvCPU)
	}
	restoreDir := filepath.Join(c.work, "restore")
	clean := func() { os.RemoveAll(restoreDir) }
	for _, sr := range transferRuns(s, sets) {
		store, m, env, tools, scheme := sr.name, sr.minio, s.GCSEnv(), []string{"spotagent", "curl"}, "gs"
		if m != nil {
			env, tools, scheme = m.Env(), []string{"spotagent", "aws cli", "curl"}, "s3"
			if os.Getenv("SPOTBENCH_NO_AWSCLI") != "" {
				tools = []string{"spotagent", "curl"}
			}
		}
		if baseBench != "" {
			tools = append(tools, baseTool)
		}
		for _, ds := range sr.sets {
			// Repetition -1 is a warm-up, not recorded: the first transfer
			// after a data set change runs against a cold server (in the
			// 2026-11-22 run every tool's first 1 GiB upload was the
			// slowest by 30-50 %).
			for rep := -1; rep < c.reps; rep++ {
				record := rep >= 0
				r0 := max(rep, 0)
				order := append(tools[r0%len(tools):], tools[:r0%len(tools)]...)
				order = append([]string(nil), order...)
				saURI := fmt.Sprintf("%s://%s/up/sa-%s-%d", scheme, benchstore.Bucket, ds.name, rep)
				baseURI := fmt.Sprintf("%s://%s/up/base-%s-%d", scheme, benchstore.Bucket, ds.name, rep)
				rawKey := fmt.Sprintf("up/raw-%s-%d", ds.name, rep)
				cliPrefix := fmt.Sprintf("s3://%s/up/cli-%s-%d/", benchstore.Bucket, ds.name, rep)
				// Upload.
				for _, tool := range order {
					var d time.Duration
					var rss int64
					var cpu float64
					var err error
					srv0 := m.CPU()
					switch {
					case tool == baseTool:
						d, rss, cpu, err = proc.Run(env, io.Discard, baseBench, "commit", "--store", baseURI, "--dir", ds.dir)
					case tool == "spotagent":
						d, rss, cpu, err = proc.Run(env, io.Discard, c.self, "commit", "--store", saURI, "--dir", ds.dir)
						r.Command("spotbench commit --store s3://bench/up/sa-DATASET-REP --dir DATASET_DIR   # pkg/checkpoint Committer, the agent's defaults (also gs://)")
					case tool == "aws cli":
						d, rss, cpu, err = proc.Run(env, io.Discard, "aws", "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", m.URL, ds.dir, cliPrefix)
						r.Command("aws s3 cp --recursive --only-show-errors --endpoint-url http://127.0.0.1:PORT DATASET_DIR s3://bench/up/cli-DATASET-REP/")
					case m != nil:
						var u string
						if u, err = m.PresignPut(rawKey); err == nil {
							d, rss, cpu, err = proc.Run(nil, io.Discard, "curl", "-sS", "-f", "-o", "/dev/null", "-T", ds.cat, u)
						}
						r.Command("curl -sS -f -o /dev/null -T DATASET.cat 'PRESIGNED_PUT_URL'   # one stream, all the bytes")
					default:
						u := fmt.Sprintf("http://%s/upload/storage/v1/b/%s/o?uploadType=media&name=%s", s.GCSHost, benchstore.Bucket, url.QueryEscape(rawKey))
						d, rss, cpu, err = proc.Run(nil, io.Discard, "curl", "-sS", "-f", "-o", "/dev/null", "-X", "POST", "-H", "Content-Type: application/octet-stream", "-T", ds.cat, u)
						r.Command("curl -sS -f -o /dev/null -X POST -H 'Content-Type: application/octet-stream' -T DATASET.cat 'http://127.0.0.1:PORT/upload/storage/v1/b/bench/o?uploadType=media&name=KEY'")
					}
					if err != nil {
						return err
					}
					if record {
						add(key{store, ds.name, "upload", tool}, ds.bytes, d, rss, cpu, m.CPU()-srv0)
					} else {
						logf("%-7s %-6s %-8s %-10s %7.1f MB/s  (warm-up, not recorded)", store, ds.name, "upload", tool, stats.MBps(ds.bytes, d))
					}
				}
				// Restore (download + verify for spotagent) of the same objects.
				restoreOrder := order
				if !sr.restore {
					restoreOrder = nil
				}
				for _, tool := range restoreOrder {
					clean()
					var d time.Duration
					var rss int64
					var cpu float64
					var err error
					srv0 := m.CPU()
					switch {
					case tool == baseTool:
						if baseAgent == "" {
							continue
						}
						d, rss, cpu, err = proc.Run(env, io.Discard, baseAgent, "restore", "--store", baseURI, "--dest", restoreDir)
					case tool == "spotagent":
						args := []string{"restore", "--store", saURI, "--dest", restoreDir}
						d, rss, cpu, err = proc.Run(env, io.Discard, c.bin, args...)
						r.Command("spotagent restore --store s3://bench/up/sa-DATASET-REP --dest TMP/restore   # download + CRC32C verify (also gs://)")
					case tool == "aws cli":
						d, rss, cpu, err = proc.Run(env, io.Discard, "aws", "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", m.URL,
							strings.TrimSuffix(saURI, "/")+"/checkpoints/", restoreDir)
						r.Command("aws s3 cp --recursive --only-show-errors --endpoint-url http://127.0.0.1:PORT s3://bench/up/sa-DATASET-REP/checkpoints/ TMP/restore   # the same objects")
					case m != nil:
						var u string
						if u, err = m.PresignGet(rawKey); err == nil {
							os.MkdirAll(restoreDir, 0o755)
							d, rss, cpu, err = proc.Run(nil, io.Discard, "curl", "-sS", "-f", "-o", filepath.Join(restoreDir, "raw"), u)
						}
						r.Command("curl -sS -f -o TMP/restore/raw 'PRESIGNED_GET_URL'")
					default:
						os.MkdirAll(restoreDir, 0o755)
						u := fmt.Sprintf("http://%s/storage/v1/b/%s/o/%s?alt=media", s.GCSHost, benchstore.Bucket, url.PathEscape(rawKey))
						d, rss, cpu, err = proc.Run(nil, io.Discard, "curl", "-sS", "-f", "-o", filepath.Join(restoreDir, "raw"), u)
						r.Command("curl -sS -f -o TMP/restore/raw 'http://127.0.0.1:PORT/storage/v1/b/bench/o/KEY?alt=media'")
					}
					if err != nil {
						return err
					}
					if record {
						add(key{store, ds.name, "restore", tool}, ds.bytes, d, rss, cpu, m.CPU()-srv0)
					}
				}
				clean()
				// Free the server's memory before the next repetition.
				uris := []string{saURI}
				if baseBench != "" {
					uris = append(uris, baseURI)
				}
				if m != nil {
					uris = append(uris, strings.TrimSuffix(cliPrefix, "/"))
				}
				for _, u := range uris {
					if err := benchstore.DeletePrefix(env, u); err != nil {
						logf("cleanup %s: %v", u, err)
					}
				}
				if err := s.DeleteRaw(m, rawKey); err != nil {
					logf("cleanup %s: %v", rawKey, err)
				}
				s.EmptyTrash()
			}
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "Loopback, %d repetitions per cell after one unrecorded warm-up round, tools alternating (the order rotates every repetition). MB/s = 10⁶ bytes/s of checkpoint data over the wall time of the whole command (process start included: that is what a user waits for). Medians, with min–max. Source files are in the page cache. S3: MinIO (single drive, data on tmpfs). The 1 GiB upload also runs against a second MinIO started with `--no-compat`, which skips the MD5 it otherwise takes of every byte for the ETag (half of its CPU in these uploads; neither client asks for it): with the server's work off the shared cores, as with a real bucket, that row shows the clients more than the server. GCS: fake-gcs-server (in memory, separate process); no AWS CLI there, so spotagent vs the single-stream ceiling only.\n\n", c.reps)
	fmt.Fprintf(&b, "- **spotagent upload** = a real checkpoint commit through `pkg/checkpoint` (`Committer`, the agent's defaults: 4 files at once, 16 MiB × 8 S3 parts sent from the files, CRC32C while streaming, manifest, latest.json).\n")
	fmt.Fprintf(&b, "- **spotagent restore** = `spotagent restore` (manifest, parallel ranged reads, CRC32C verify).\n")
	fmt.Fprintf(&b, "- **curl** = one PUT (S3 presigned / GCS media upload) or one GET of the same bytes concatenated into one object: the single-stream ceiling.\n\n")
	b.WriteString("| store | data set | op | spotagent MB/s | aws cli MB/s | curl 1-stream MB/s | spotagent ÷ aws cli | spotagent ÷ curl | spotagent peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	cell := func(k key) (string, float64) {
		sm := res[k]
		if sm == nil {
			return "–", 0
		}
		lo, hi := stats.MinMax(sm.mbps)
		m := stats.Median(sm.mbps)
		return fmt.Sprintf("%.0f (%.0f–%.0f)", m, lo, hi), m
	}
	for _, sr := range transferRuns(s, sets) {
		store := sr.name
		ops := []string{"upload"}
		if sr.restore {
			ops = append(ops, "restore")
		}
		for _, ds := range sr.sets {
			for _, op := range ops {
				sa, saM := cell(key{store, ds.name, op, "spotagent"})
				cli, cliM := cell(key{store, ds.name, op, "aws cli"})
				raw, rawM := cell(key{store, ds.name, op, "curl"})
				ratio := func(a, b float64) string {
					if b == 0 {
						return "–"
					}
					return fmt.Sprintf("%.2f×", a/b)
				}
				rss := "–"
				if sm := res[key{store, ds.name, op, "spotagent"}]; sm != nil {
					rss = fmt.Sprintf("%.0f", slicesMax(sm.rss))
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sr.label, ds.label, op, sa, cli, raw, ratio(saM, cliM), ratio(saM, rawM), rss)
				if sr.minio != nil && cliM > 0 {
					x := saM / cliM
					r.Target(report.Target{Name: fmt.Sprintf("%s vs AWS CLI, %s%s", op, ds.label, sr.suffix), Want: "≥ 1.5× aws s3 cp",
						Got: fmt.Sprintf("%.2f× (%.0f vs %.0f MB/s)", x, saM, cliM), Met: x >= 1.5, Margin: fmt.Sprintf("%+.2f×", x-1.5)})
				}
			}
		}
	}
	// Where the CPU goes: on 2 shared cores, the client's and the server's
	// core-seconds together set the throughput.
	b.WriteString("\nCPU per 1 GiB upload, medians in core-seconds (user + system): the tool's process, and MinIO's meanwhile. Client and server share the machine's cores, so a client that costs the server less also leaves it more CPU.\n\n")
	b.WriteString("| server | tool | MB/s | tool CPU s | MinIO CPU s | together s |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, sr := range transferRuns(s, sets) {
		if sr.minio == nil {
			continue
		}
		for _, tool := range []string{"spotagent", baseTool, "aws cli", "curl"} {
			sm := res[key{sr.name, "1gib", "upload", tool}]
			if sm == nil {
				continue
			}
			cpu, srv := stats.Median(sm.cpu), stats.Median(sm.srvCPU)
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.2f | %.2f | %.2f |\n", sr.label, tool, stats.Median(sm.mbps), cpu, srv, cpu+srv)
		}
	}
	if baseBench != "" {
		b.WriteString("\nSide by side with the baseline (" + baseTool + ", the same run, turns alternating): medians, CPU in core-seconds (user + system) of the tool's process.\n\n")
		b.WriteString("| store | data set | op | spotagent MB/s | base MB/s | curl MB/s | spotagent ÷ curl | base ÷ curl | spotagent CPU s | base CPU s | curl CPU s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, sr := range transferRuns(s, sets) {
			for _, ds := range sr.sets {
				for _, op := range []string{"upload", "restore"} {
					sa, base, raw := res[key{sr.name, ds.name, op, "spotagent"}], res[key{sr.name, ds.name, op, baseTool}], res[key{sr.name, ds.name, op, "curl"}]
					if sa == nil {
						continue
					}
					f := func(sm *sample, cpu bool) float64 {
						if sm == nil {
							return 0
						}
						if cpu {
							return stats.Median(sm.cpu)
						}
						return stats.Median(sm.mbps)
					}
					ratio := func(a, b float64) string {
						if b == 0 || a == 0 {
							return "–"
						}
						return fmt.Sprintf("%.2f×", a/b)
					}
					fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %.0f | %.0f | %s | %s | %.2f | %.2f | %.2f |\n", sr.label, ds.label, op,
						f(sa, false), f(base, false), f(raw, false), ratio(f(sa, false), f(raw, false)), ratio(f(base, false), f(raw, false)),
						f(sa, true), f(base, true), f(raw, true))
				}
			}
		}
	}
	r.Add("2–3. Upload and restore throughput", b.String())
	return nil
}

func slicesMax(xs []float64) float64 {
	_, hi := stats.MinMax(xs)
	return hi
}
