package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/service"

	"github.com/spotagent/spotagent/bench/internal/proc"
	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/internal/testsrv/azuritetest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

// benchAzure is issue 50's figure: one checkpoint file uploaded to and
// restored from Azurite by spotagent (a real commit, `spotbench commit`,
// and `spotagent restore`, which verifies what it wrote) and by azcopy
// (`azcopy copy`, a SAS; --from-to, since azcopy cannot tell an
// emulator's URL is a blob), turns alternating, with each tool's CPU and
// Azurite's meanwhile. azcopy runs twice: at its own default concurrency
// and at spotagent's (8 blocks of 16 MiB in flight).
func benchAzure(c *config, r *report.Report) error {
	dir := filepath.Join(c.work, "azure")
	if err := os.MkdirAll(filepath.Join(dir, "ckpt"), 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	srv, err := azuritetest.Start(ctx, dir)
	if err != nil {
		return err
	}
	defer srv.Close()
	size := int64(c.azureMiB) << 20
	src := filepath.Join(dir, "ckpt", "model.pt")
	if err := writeRandom(src, size); err != nil {
		return err
	}
	token, err := azureSAS()
	if err != nil {
		return err
	}
	env := append(srv.Env(), "AZCOPY_LOG_LOCATION="+dir, "AZCOPY_JOB_PLAN_LOCATION="+filepath.Join(dir, "plans"),
		"AZCOPY_DISABLE_SYSLOG=true")
	tools := []string{"spotagent"}
	if _, err := os.Stat(c.azcopy); err == nil {
		tools = append(tools, "azcopy", "azcopy-c8")
	} else {
		logf("azure: no azcopy at %s (%v): spotagent alone", c.azcopy, err)
	}
	type cell struct{ mbps, cpu, srvCPU []float64 }
	res := map[string]*cell{}
	srvCPU := func() float64 { t, _ := proc.CPUTicks(srv.Pid()); return float64(t) / 100 }
	for rep := range c.reps {
		for i := range tools {
			tool := tools[(i+rep)%len(tools)]
			prefix := fmt.Sprintf("%s-%d", tool, rep)
			uri := "az://" + azuritetest.Container + "/" + prefix
			blobURL := srv.Endpoint + "/" + azuritetest.Container + "/" + prefix + "/model.pt?" + token
			dest := filepath.Join(dir, "restore-"+prefix)
			for _, op := range []string{"upload", "download"} {
				s0 := srvCPU()
				var d time.Duration
				var cpu float64
				var err error
				aenv := env
				if tool == "azcopy-c8" {
					aenv = append(env, "AZCOPY_CONCURRENCY_VALUE=8")
				}
				switch {
				case tool == "spotagent" && op == "upload":
					d, _, cpu, err = proc.Run(env, io.Discard, c.self, "commit", "--store", uri, "--dir", filepath.Dir(src))
				case tool == "spotagent":
					d, _, cpu, err = proc.Run(env, io.Discard, c.bin, "restore", "--store", uri, "--dest", dest)
				case op == "upload":
					d, _, cpu, err = proc.Run(aenv, io.Discard, c.azcopy, "copy", src, blobURL, "--from-to", "LocalBlob", "--block-size-mb", "16", "--log-level", "ERROR")
				default:
					d, _, cpu, err = proc.Run(aenv, io.Discard, c.azcopy, "copy", blobURL, dest+"-f", "--from-to", "BlobLocal", "--log-level", "ERROR")
				}
				if err != nil {
					return fmt.Errorf("azure %s %s: %w", tool, op, err)
				}
				k := tool + " " + op
				if res[k] == nil {
					res[k] = &cell{}
				}
				sc := srvCPU() - s0
				res[k].mbps = append(res[k].mbps, stats.MBps(size, d))
				res[k].cpu = append(res[k].cpu, cpu)
				res[k].srvCPU = append(res[k].srvCPU, sc)
				logf("azure %-9s %-8s %7.1f MB/s  %5.2fs  cpu %.2fs, azurite %.2fs", tool, op, stats.MBps(size, d), d.Seconds(), cpu, sc)
			}
			os.RemoveAll(dest)
			os.RemoveAll(dest + "-f")
			if err := emptyAzure(ctx, uri, env); err != nil {
				logf("azure cleanup %s: %v", uri, err)
			}
		}
	}
	var b strings.Builder
	gib := float64(size) / (1 << 30)
	fmt.Fprintf(&b, "One %d MiB file, %d repetitions, tools alternating; Azurite %s in memory on loopback (one Node process) on the same cores. "+
		"spotagent: `spotbench commit` (the agent's commit: upload, CRC32C, manifest, latest.json; 16 MiB blocks, 8 in flight) and `spotagent restore` (download and verification). "+
		"azcopy: `azcopy copy` of the file with a SAS, 16 MiB blocks, at its default concurrency and at 8 (`AZCOPY_CONCURRENCY_VALUE=8`, spotagent's). "+
		"Medians; CPU in core-seconds per GiB (user + system), the tool's process and Azurite's meanwhile.\n\n", c.azureMiB, c.reps, azuritetest.Version)
	b.WriteString("| tool | op | MB/s | tool CPU s/GiB | Azurite CPU s/GiB |\n| --- | --- | --- | --- | --- |\n")
	for _, op := range []string{"upload", "download"} {
		for _, tool := range tools {
			cl := res[tool+" "+op]
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.2f | %.2f |\n", tool, op, stats.Median(cl.mbps), stats.Median(cl.cpu)/gib, stats.Median(cl.srvCPU)/gib)
		}
	}
	if a := res["azcopy upload"]; a != nil {
		fmt.Fprintf(&b, "\nUpload, spotagent ÷ azcopy: %.2f× (azcopy at 8: %.2f×). Download: %.2f× (%.2f×).\n",
			stats.Median(res["spotagent upload"].mbps)/stats.Median(a.mbps), stats.Median(res["spotagent upload"].mbps)/stats.Median(res["azcopy-c8 upload"].mbps),
			stats.Median(res["spotagent download"].mbps)/stats.Median(res["azcopy download"].mbps), stats.Median(res["spotagent download"].mbps)/stats.Median(res["azcopy-c8 download"].mbps))
	}
	r.Add("Azure Blob: spotagent vs azcopy against Azurite", b.String())
	return nil
}

// writeRandom writes size pseudo-random bytes (incompressible) to p.
func writeRandom(p string, size int64) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.LimitReader(rand.NewChaCha8([32]byte{50}), size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// azureSAS is a two-hour account SAS of Azurite's development account.
func azureSAS() (string, error) {
	cred, err := service.NewSharedKeyCredential(azuritetest.Account, azuritetest.Key)
	if err != nil {
		return "", err
	}
	q, err := sas.AccountSignatureValues{
		Protocol: sas.ProtocolHTTPSandHTTP, StartTime: time.Now().Add(-time.Hour), ExpiryTime: time.Now().Add(2 * time.Hour),
		Permissions:   (&sas.AccountPermissions{Read: true, Write: true, Delete: true, List: true, Create: true, Add: true}).String(),
		ResourceTypes: (&sas.AccountResourceTypes{Service: true, Container: true, Object: true}).String(),
	}.SignWithSharedKey(cred)
	if err != nil {
		return "", err
	}
	return q.Encode(), nil
}

// emptyAzure deletes what a repetition left under uri, so Azurite's memory
// holds one copy at a time.
func emptyAzure(ctx context.Context, uri string, env []string) error {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "AZURE_STORAGE_CONNECTION_STRING" {
			os.Setenv(k, v)
		}
	}
	st, err := all.Open(ctx, uri, all.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	var keys []string
	if err := st.List(ctx, "", func(oi cloud.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
		return err
	}
	for _, k := range keys {
		if err := st.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
