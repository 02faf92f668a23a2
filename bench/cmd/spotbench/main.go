// Command spotbench is what `make bench` runs: it measures spotagent the way
// users meet it (the real binary, real S3 and GCS protocol servers on
// loopback, the fake metadata servers) side by side with the alternatives,
// and writes bench/RESULTS.md. It is not a test: nothing here runs in
// `make test`.
//
//	go run ./bench/cmd/spotbench -bin bin/spotagent -minio bench/cache/bin/minio
//
// Sections (-only picks some): latency, transfer, e2e, footprint, simulate,
// pipeline (issue 16: serial vs pipelined save and commit, PyTorch),
// distributed (issue 15: notice → job-wide commit, 2 nodes × 2 ranks),
// fleet (issue 29: `spotagent fleet` over 10,000 synthetic runs),
// watch (issue 27: zero-code mode's watcher, restore RSS and lost steps,
// through bench/cmd/watchbench; -watchbench names its binary).
// overlap (issue 30 item 1: agent start → first resumed step, serial vs
// overlapped restore).
// peer (issue 38 item 2: node 1 replaced, 2 × 2 and 4 × 1 jobs: bytes from the store,
// agent start → restored and → first resumed step on every node, store vs peer; peer.go).
// peernet (issue 38's figure: one peer transfer against one TCP stream between two network
// namespaces, and the local tier's verification rate; bench/internal/peernet; needs root).
// digest (issue 46: commit CPU per GiB with CRC32C only and with the BLAKE3 digest, each
// hash alone, and a local copy's verification rate; digest.go).
// azure (issue 50: one file to and from Azurite, spotagent vs azcopy;
// azure.go; -azcopy names azcopy's binary, -azure-mib the size).
// detect (issue 51 item 1: a silent node's survivors exit 75, and no exit
// for 1 s pauses, 1 s loss bursts and 5 % loss; detect.go; root for its
// network namespaces and netem).
// k8s (issue 45's figure: a JobSet's whole-set restart on the real control
// plane and JobSet controller, copies on a hostPath: bytes by source and
// restart → first resumed step; k8s.go; -k8s-reps runs of the deploy test;
// skipped, and said so, without make kcp-controllers' cache).
// recovery (issue 51 item 3: a notice, a lost node and a whole-job restart
// timed from the event to every rank's first resumed step, 2 × 2 under
// torchrun, the orchestrator's restart delay modelled; recovery.go).
// Internal subcommands, run as child processes so that their time and peak
// RSS are theirs alone: `spotbench commit ...` (a checkpoint commit through
// pkg/checkpoint, exactly what the agent runs) and `spotbench gcs-server`
// (fake-gcs-server, in memory, until killed).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/bench/internal/benchstore"
	"github.com/spotagent/spotagent/bench/internal/peernet"
	"github.com/spotagent/spotagent/bench/internal/report"
)

type config struct {
	bin, minio, work, out string
	reps, notices         int
	e2eReps               int
	idle                  time.Duration
	idleRuns              int    // runs of the footprint section
	baselineBin           string // an older build measured beside c.bin in the footprint section
	only                  map[string]bool
	self                  string
	pollInterval          time.Duration
	pipelineGiB           string          // checkpoint sizes of the pipeline section
	overlapGiB            float64         // checkpoint size of the overlap section
	overlapReps           int             // overlap section: runs per trainer and mode
	peerMiB               int             // peer section: bytes per node (peer.go)
	digestMiB             int             // digest section: the file's size (digest.go)
	azureMiB              int             // azure section: the file's size (azure.go)
	azcopy                string          // azure section: azcopy's binary
	watchbench            string          // bench/cmd/watchbench, for the watch section
	fleetAgents           int             // fleet section: agents ending at once
	fleetRuns             []int           // fleet section: fleet sizes of the start-up read and `fleet`
	fleetReps             int             // fleet section: repetitions (at least 3)
	fleetOldDeadline      time.Duration   // fleet section: where the old summary's burst is cut
	detectReps            int             // detect section: silent-node runs
	detectPairs           int             // detect section: monitor pairs of the blip trials
	detectLoss            time.Duration   // detect section: how long the 5 % loss lasts
	detectTimeouts        []time.Duration // detect section: timeouts of the blip trials
	detectRing            int             // detect section: monitors of the cost figure
	k8sReps               int             // k8s section: runs of the deploy test (k8s.go)
	recoveryReps          int             // recovery section: runs per case
	recoveryMiB           int             // recovery section: checkpoint bytes per node
	recoveryDelay         time.Duration   // recovery section: the modelled restart delay
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "commit":
			os.Exit(benchstore.Commit(os.Args[2:]))
		case "gcs-server":
			os.Exit(benchstore.ServeGCS(os.Args[2:]))
		case "peernet": // the peernet section's children (bench/internal/peernet)
			os.Exit(peernet.Child(os.Args[2:]))
		case "detect-node", "detect-ring": // the detect section's children (detect.go)
			os.Exit(detectChild(os.Args[1], os.Args[2:]))
		}
	}
	var c config
	var only string
	flag.StringVar(&c.bin, "bin", "bin/spotagent", "the spotagent binary under test")
	flag.StringVar(&c.minio, "minio", "bench/cache/bin/minio", "the MinIO server binary")
	flag.StringVar(&c.work, "work", "/tmp/spotbench", "scratch directory (removed at the end)")
	flag.StringVar(&c.out, "out", "bench/RESULTS.md", "where the report goes")
	flag.IntVar(&c.reps, "reps", 3, "repetitions of each transfer, per tool and data set")
	flag.IntVar(&c.e2eReps, "e2e-reps", 3, "repetitions of each end-to-end notice → committed run")
	flag.IntVar(&c.notices, "notices", 50, "notices per cloud for the latency figure")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "idle-polling window for the footprint figure")
	flag.IntVar(&c.idleRuns, "idle-runs", 5, "runs of the footprint section (fresh processes each): the table shows medians")
	flag.StringVar(&c.baselineBin, "baseline-bin", "", "footprint: an older spotagent binary run beside -bin, against the same fake")
	flag.StringVar(&only, "only", "latency,transfer,e2e,footprint,simulate,pipeline,distributed,fleet,watch,overlap,peer,peernet,digest,azure,detect,k8s", "sections to run")
	flag.StringVar(&c.watchbench, "watchbench", "bench/cache/bin/watchbench", "the watchbench binary (watch section)")
	flag.StringVar(&c.pipelineGiB, "pipeline-gib", "1,4,8", "checkpoint sizes (GiB) of the pipeline section")
	flag.Float64Var(&c.overlapGiB, "overlap-gib", 2, "checkpoint size (GiB) of the overlap section")
	flag.IntVar(&c.overlapReps, "overlap-reps", 5, "overlap section: runs per trainer and mode (calibration, serial, overlapped)")
	flag.IntVar(&c.peerMiB, "peer-mib", 1024, "peer section: checkpoint bytes per node (MiB)")
	flag.IntVar(&c.digestMiB, "digest-mib", 1024, "digest section: the file's size (MiB)")
	flag.IntVar(&c.azureMiB, "azure-mib", 1024, "azure section: the file's size (MiB)")
	flag.StringVar(&c.azcopy, "azcopy", filepath.Join(os.Getenv("HOME"), ".cache", "spotagent-azcopy", "azcopy"), "azure section: azcopy's binary (built from source; absent: spotagent alone)")
	peerNetMiB := flag.Int("peernet-mib", 1024, "peernet section: the file's size (MiB)")
	var fleetRuns, detectTimeouts string
	flag.IntVar(&c.detectReps, "detect-reps", 3, "detect section: silent-node runs (at least 3)")
	flag.IntVar(&c.detectPairs, "detect-pairs", 10, "detect section: monitor pairs paused at once (10 rounds each)")
	flag.DurationVar(&c.detectLoss, "detect-loss", time.Minute, "detect section: how long the 5 % loss lasts")
	flag.StringVar(&detectTimeouts, "detect-timeouts", "1.2s,2s", "detect section: timeouts of the blip trials (the default's is the target)")
	flag.IntVar(&c.detectRing, "detect-ring", 1000, "detect section: monitors in the cost figure's ring")
	flag.IntVar(&c.k8sReps, "k8s-reps", 3, "k8s section: runs of the deploy test (each a fresh control plane)")
	flag.IntVar(&c.recoveryReps, "recovery-reps", 3, "recovery section: runs per case")
	flag.IntVar(&c.recoveryMiB, "recovery-mib", 128, "recovery section: checkpoint bytes per node (MiB)")
	flag.DurationVar(&c.recoveryDelay, "recovery-restart-delay", 2*time.Second, "recovery section: the orchestrator's restart delay modelled (JobSet: 2 s, deploy/README.md)")
	flag.IntVar(&c.fleetAgents, "fleet-agents", 1000, "fleet section: agents ending at once")
	flag.StringVar(&fleetRuns, "fleet-runs", "10000,100000", "fleet section: fleet sizes for the start-up read and `spotagent fleet`")
	flag.IntVar(&c.fleetReps, "fleet-reps", 3, "fleet section: repetitions (at least 3)")
	flag.DurationVar(&c.fleetOldDeadline, "fleet-old-deadline", 2*time.Minute, "fleet section: the old single summary's burst is cut here (its sessions then lost)")
	flag.Parse()
	for _, f := range strings.Split(fleetRuns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fatal(fmt.Errorf("-fleet-runs %q: want sizes such as 10000,100000", fleetRuns))
		}
		c.fleetRuns = append(c.fleetRuns, n)
	}
	for _, f := range strings.Split(detectTimeouts, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			fatal(fmt.Errorf("-detect-timeouts %q: want durations such as 1.2s,2s", detectTimeouts))
		}
		c.detectTimeouts = append(c.detectTimeouts, d)
	}
	if c.k8sReps < 1 {
		fatal(fmt.Errorf("-k8s-reps must be at least 1"))
	}
	if c.recoveryReps < 1 || c.recoveryMiB < 1 || c.recoveryDelay < 0 {
		fatal(fmt.Errorf("-recovery-reps and -recovery-mib must be at least 1, -recovery-restart-delay not negative"))
	}
	if c.detectReps < 3 || c.detectPairs < 1 || c.detectRing < 2 {
		fatal(fmt.Errorf("-detect-reps must be at least 3, -detect-pairs at least 1, -detect-ring at least 2"))
	}
	c.pollInterval = time.Second
	c.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		c.only[strings.TrimSpace(s)] = true
	}
	var err error
	if c.self, err = os.Executable(); err != nil {
		fatal(err)
	}
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		fatal(err)
	}
	if c.minio, err = filepath.Abs(c.minio); err != nil {
		fatal(err)
	}
	if c.watchbench, err = filepath.Abs(c.watchbench); err != nil {
		fatal(err)
	}
	if err := os.MkdirAll(c.work, 0o755); err != nil {
		fatal(err)
	}
	if os.Getenv("SPOTBENCH_KEEP_WORK") == "" { // set: keep the logs (and data) for a post-mortem
		defer os.RemoveAll(c.work)
	}
	r := report.New(c.bin, c.minio)
	if c.only["latency"] {
		step("notice → checkpoint latency")
		must(benchLatency(&c, r))
	}
	var env *benchstore.Stores
	if c.baselineBin != "" {
		if c.baselineBin, err = filepath.Abs(c.baselineBin); err != nil {
			fatal(err)
		}
	}
	if c.only["transfer"] || c.only["e2e"] || c.only["pipeline"] || c.only["distributed"] {
		step("starting MinIO and fake-gcs-server")
		env, err = benchstore.Start(c.minio, c.work, c.self)
		must(err)
		logf("minio %s (data %s), minio --no-compat %s, fake-gcs-server %s", env.MinIO.URL, env.MinIO.Data, env.Lean.URL, env.GCSHost)
		defer env.Close()
		atFatal = append(atFatal, env.Close) // fatal exits without running defers
	}
	if c.only["transfer"] {
		step("upload and restore throughput")
		must(benchTransfer(&c, r, env))
	}
	if c.only["e2e"] {
		step("notice → checkpoint committed, end to end")
		must(benchE2E(&c, r, env))
	}
	if env != nil {
		env.StopGCS() // only transfer and e2e use it
		logf("fake-gcs-server stopped (the later sections use MinIO)")
	}
	if c.only["footprint"] {
		step("idle footprint")
		must(benchIdle(&c, r))
	}
	if c.only["pipeline"] {
		step("pipelined commit and non-blocking save")
		must(benchPipeline(&c, r, env))
	}
	if c.only["distributed"] {
		step("multi-node: notice → job-wide commit")
		must(benchDistributed(&c, r, env))
	}
	if c.only["simulate"] {
		step("simulate --grid")
		must(benchSimulate(&c, r))
	}
	if c.only["fleet"] {
		step("fleet view over 10,000 runs")
		must(benchFleet(&c, r))
		step("fleet records at fleet scale (MinIO)")
		must(benchFleetScale(&c, r))
	}
	if c.only["watch"] {
		step("zero-code mode: watcher, restore RSS, lost steps")
		must(benchWatch(&c, r))
	}
	if c.only["overlap"] {
		step("restore overlapped with the trainer's start")
		must(benchOverlap(&c, r))
	}
	if c.only["peer"] {
		step("restore from a peer: node 1 replaced")
		must(benchPeer(&c, r))
	}
	if c.only["peernet"] {
		step("peer transfer between two network namespaces")
		must(peernet.Bench(r, peernet.Options{Self: c.self, Work: c.work, MiB: *peerNetMiB, Rounds: max(5, c.e2eReps)}))
	}
	if c.only["digest"] {
		step("digest cost: commit and verification")
		must(benchDigest(&c, r))
	}
	if c.only["azure"] {
		step("Azure Blob: spotagent vs azcopy against Azurite")
		must(benchAzure(&c, r))
	}
	if c.only["detect"] {
		step("silent node detection and blips (issue 51)")
		must(benchDetect(&c, r))
	}
	if c.only["k8s"] {
		step("Kubernetes: whole-set restart with copies that outlive the pods (issue 45)")
		must(benchK8s(&c, r))
	}
	if c.only["recovery"] {
		step("recovery end to end: notice, lost node, whole-job restart (issue 51)")
		must(benchRecovery(&c, r))
	}
	text := r.Markdown()
	if err := os.WriteFile(c.out, []byte(text), 0o644); err != nil {
		fatal(err)
	}
	fmt.Println()
	fmt.Print(text)
	fmt.Fprintf(os.Stderr, "spotbench: wrote %s in %s\n", c.out, r.Took().Round(time.Second))
}
