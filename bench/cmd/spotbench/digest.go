package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// The digest section (issue 46 item 1): what the BLAKE3 digest a commit
// records beside CRC32C costs. Measured in this process, by its CPU time
// (getrusage: user + system), over one file of -digest-mib random bytes
// hot in the page cache:
//   - each hash alone over the bytes in memory (256 KiB steps, as a commit
//     hashes them): CRC32C, BLAKE3, and sha256 for comparison;
//   - the commit's upload path into a file:// store, before (the file's
//     CRC32C only, as the commit took it until #46) and after (CRC32C and
//     digest in the same pass, checkpoint.Sums): the same Store.Put of a
//     checkpoint.CountingReader the commit hands it;
//   - a whole commit (commit.Committer, file:// store), after;
//   - the verification of a local copy against its digest (what restore
//     does to a local-tier or reused copy), GB per CPU-second.
func benchDigest(c *config, r *report.Report) error {
	dir := filepath.Join(c.work, "digest")
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	size := int64(c.digestMiB) << 20
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{46}).Read(data) // incompressible, without waiting on the kernel's entropy
	path := filepath.Join(src, "model.bin")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		return err
	}
	gib := float64(size) / (1 << 30)
	reps := max(3, c.e2eReps)
	perGiB := func(f func() error) ([]float64, error) {
		var xs []float64
		for range reps {
			c0 := cpuNow()
			if err := f(); err != nil {
				return nil, err
			}
			xs = append(xs, (cpuNow()-c0).Seconds()/gib)
		}
		return xs, nil
	}
	alone := func(h func() hash.Hash) func() error {
		return func() error {
			hh := h()
			for off := int64(0); off < size; off += 256 << 10 {
				hh.Write(data[off:min(off+256<<10, size)])
			}
			hh.Sum(nil)
			return nil
		}
	}
	put := func(h io.Writer) func() error {
		return func() error {
			fh, err := os.Open(path)
			if err != nil {
				return err
			}
			defer fh.Close()
			cr := &checkpoint.CountingReader{R: io.LimitReader(fh, size+1), H: h, P: &checkpoint.Progress{}}
			return st.Put(context.Background(), "put/model.bin", cr, size, cloud.PutOptions{})
		}
	}
	step := int64(0)
	commitOnce := func() error {
		step++
		cm := &commit.Committer{Store: st, RunID: "digest"}
		_, err := cm.Commit(context.Background(), commit.Request{Dir: src, ID: fmt.Sprintf("d%d", step), Step: step, Reason: "periodic"})
		return err
	}
	f := checkpoint.File{Path: "model.bin", Size: size}
	sums := checkpoint.NewSums()
	sums.Write(data)
	f.CRC32C, f.BLAKE3 = sums.CRC32C(), sums.Digest()
	verify := func(digest bool) func() error {
		return func() error {
			fh, err := os.Open(path)
			if err != nil {
				return err
			}
			defer fh.Close()
			if digest {
				return f.VerifyDigest(fh)
			}
			return f.Verify(fh)
		}
	}
	rows := []struct {
		name string
		f    func() error
	}{
		{"CRC32C alone", alone(func() hash.Hash { return checkpoint.NewCRC32C() })},
		{"BLAKE3 alone (the digest)", alone(checkpoint.NewDigest)},
		{"sha256 alone (not chosen)", alone(sha256.New)},
		{"upload path, before: CRC32C", nil},
		{"upload path, after: CRC32C + BLAKE3", nil},
		{"whole commit, after", commitOnce},
		{"verify a local copy: CRC32C (the store's check)", verify(false)},
		{"verify a local copy: BLAKE3 (nearby copies)", verify(true)},
	}
	// Before and after alternate, run by run, so that a change of the
	// machine's load weighs on both alike.
	pairs := map[string][]float64{}
	for range reps {
		for _, pf := range []struct {
			name string
			h    func() io.Writer
		}{{rows[3].name, func() io.Writer { return checkpoint.NewCRC32C() }}, {rows[4].name, func() io.Writer { return checkpoint.NewSums() }}} {
			c0 := cpuNow()
			if err := put(pf.h())(); err != nil {
				return fmt.Errorf("%s: %w", pf.name, err)
			}
			pairs[pf.name] = append(pairs[pf.name], (cpuNow()-c0).Seconds()/gib)
		}
	}
	med := map[string]float64{}
	var b strings.Builder
	fmt.Fprintf(&b, "One file of %d MiB of random bytes, hot in the page cache; this process's CPU time (user + system) per GiB, %d runs each, medians (min–max). The upload path is the commit's: `Store.Put` of a `checkpoint.CountingReader` into a `file://` store, hashing 256 KiB at a time; *before* takes the CRC32C only (the commit until #46), *after* the CRC32C and the BLAKE3 digest in the same pass (`checkpoint.Sums`). Verification reads the copy and checks it (`File.Verify`, `File.VerifyDigest`).\n\n", c.digestMiB, reps)
	b.WriteString("| what | core-s per GiB | GB per CPU-second |\n| --- | --- | --- |\n")
	for _, row := range rows {
		xs, ok := pairs[row.name]
		if !ok {
			var err error
			if xs, err = perGiB(row.f); err != nil {
				return fmt.Errorf("%s: %w", row.name, err)
			}
		}
		m := stats.Median(xs)
		lo, hi := stats.MinMax(xs)
		med[row.name] = m
		fmt.Fprintf(&b, "| %s | %.3f (%.3f–%.3f) | %.2f |\n", row.name, m, lo, hi, (1<<30)/1e9/m)
		logf("digest: %-48s %.3f core-s/GiB", row.name, m)
	}
	grew := med["upload path, after: CRC32C + BLAKE3"] - med["upload path, before: CRC32C"]
	own := med["BLAKE3 alone (the digest)"]
	fmt.Fprintf(&b, "\nThe commit's upload path grew by %.3f core-s per GiB; BLAKE3 alone costs %.3f.\n", grew, own)
	r.Add(fmt.Sprintf("Digest cost: commit and verification (%d MiB)", c.digestMiB), b.String())
	r.Command(fmt.Sprintf("spotbench -only digest -digest-mib %d", c.digestMiB))
	r.Target(report.Target{Name: "commit CPU growth from the digest (#46)", Want: "≤ 1.1 × the digest's own cost",
		Got: fmt.Sprintf("+%.3f core-s/GiB (BLAKE3 alone %.3f)", grew, own), Met: grew <= 1.1*own, Margin: fmt.Sprintf("%+.3f core-s/GiB", 1.1*own-grew)})
	return nil
}

// cpuNow is this process's CPU time so far (user + system).
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
