// Package integration runs the spotagent binary end to end: real trainer
// processes (Python, PyTorch), fake clouds on loopback, real stores.
package integration

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
)

// defaultParallel is -test.parallel when not given (see TestMain): above
// the package's count of parallel tests and subtests, so that Go resumes
// every paused one at once (the torch slots' order counts on it); the
// slots of parallel and parallelTorch bound the tests.
const defaultParallel = 512

// s3Creds is s3test's environment less its endpoint.
var s3Creds = []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey, "AWS_REGION=" + s3test.Region}

// gcsShared is the package's GCS server (TestMain).
var gcsShared *gcstest.Server

// startS3 starts an S3 server for the test without setting this process's
// environment (s3test.New does): open it with all.Options{S3Endpoint}.
func startS3(t *testing.T) *s3test.Server {
	t.Helper()
	srv, err := s3test.Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// Parallel tests run as many at once as their slots allow, not
// -test.parallel (TestMain sets it high unless given): a torch test
// waiting for its slot then holds none of a waiting test's.
var slots = make(chan struct{}, 4) // parallel: most of their time is waiting

// torchSlotCount is 2, or SPOTAGENT_IT_TORCH_SLOTS: the torch tests are
// the package's longest chain (18 of them, 1-2 min each on a loaded
// machine); two at a time shorten it.
func torchSlotCount() int {
	if n, err := strconv.Atoi(os.Getenv("SPOTAGENT_IT_TORCH_SLOTS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// parallel is t.Parallel for a test that touches nothing process-wide,
// holding one of 4 slots: such tests mostly wait (on trainers, intervals,
// deadlines), so on 2 cores 4 of them at once keep the CPU busy.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	waited := time.Now()
	slots <- struct{}{}
	t.Logf("ran after %s waiting for a slot", time.Since(waited).Round(time.Millisecond))
	t.Cleanup(func() { <-slots })
}

// torchClass is what a torch-slot test does to the one beside it.
type torchClass int

const (
	torchPlain   torchClass = iota
	torchBusy               // keeps the CPU busy itself (parallelBusy)
	torchBounded            // bounds how long its job takes to end (parallelTorchBounded)
)

// parallelTorch is t.Parallel for a test whose trainers are PyTorch jobs
// (ddp, torchrun): their ranks keep the CPU busy, so it holds one of the
// torch slots (torchSlotCount), beside the waiting tests. The slots go
// longest test first (torchQueue).
func parallelTorch(t *testing.T) {
	t.Helper()
	torchQueue.run(t, torchPlain)
}

// parallelBusy is parallelTorch for a test that keeps the CPU busy
// itself, as a PyTorch job does (a flood of connections or messages from
// this process at a race-built agent): it runs beside at most one PyTorch
// job and never beside a parallelTorchBounded one, whose exit bounds it
// would stretch.
func parallelBusy(t *testing.T) {
	t.Helper()
	torchQueue.run(t, torchBusy)
}

// parallelTorchBounded is parallelTorch for a test that bounds how long
// its PyTorch job takes to end (an agent exits well within the ranks' 60 s
// process-group timeout, a trainer within its grace): never beside a
// parallelBusy test. Their exits took 2-18 s against bounds of 50-110 s
// alone at load 17-24; beside one other PyTorch job they keep a margin of
// three or more.
func parallelTorchBounded(t *testing.T) {
	t.Helper()
	torchQueue.run(t, torchBounded)
}

// torchSeconds is how long each torch test held its slot in one run of the
// package (go test -json, 2 cores at load average 17-24: a third to a half
// of that on a quieter machine; only their order counts here): the
// order in which the torch slots are handed out, longest first, so that
// the last to end are short ones and both slots stay busy to the end
// (longest-processing-time-first). Go resumes the paused parallel tests
// all at once, in no set order: without this the longest could start
// last (TestNotice_Matrix once waited 712 s for its slot). A test missing
// here counts as torchSecondsDefault; a subtest missing here as its root
// test.
var torchSeconds = map[string]int{
	"TestK8sOrder_TrainerSIGTERMThenSidecar":       122,
	"TestK8sOrder_NodeModeTwoPodsOfOneJob":         102,
	"TestDistributed_NoticeOnOneNode":              88,
	"TestK8sPID1_ManifestTrainerExits75":           78,
	"TestDistributed_StoppedTrainerIsNoLoss":       75,
	"TestAzure_EndToEnd":                           75,
	"TestFlood_PeerPort":                           62, // its two floods, one after the other
	"TestDistributed_VanishedNodeRestartsWholeJob": 59,
	"TestTorchrun_DeadlineKillExits75":             42,
	"TestK8sPID1_SilentNodeTrainerExits75":         36,
	"TestWatch_NoticeAndResume":                    33,
	"TestTorchrun_SingleNodeShutdownExits75":       28,
	"TestNodeMode_SilentNodeEndsJob":               27,
	"TestWatch_TornNeverCommitted":                 26,
	"TestDistributed_PartitionedNodesEndJob":       23,
	"TestPipeline_TorchResumesExact":               22,
	"TestDistributed_SilentNodeEndsJob":            22,
	"TestNotice_Matrix":                            18, // each of its 3 cells
}

const torchSecondsDefault = 60

// torchQueue hands out the torch slots.
var torchQueue = newSlotQueue(torchSlotCount())

// slotQueue hands out a number of slots to tests in a set order: a test
// registers before t.Parallel (Go calls every top-level test function,
// up to its t.Parallel, before it resumes any), and once resumed waits
// until every test registered before it in the order got its slot, one
// is free and no test of a class it must not run beside holds one. The
// order: longest first (torchSeconds), then in registration order.
type slotQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	free    int
	holding map[torchClass]int // slots held, by class
	waiting []*slotWaiter      // registered, not yet given their slots, in order
	seq     int
	// strict: a test waits for those before it in the order that Go has
	// not resumed yet. Not under an explicit -test.parallel, which can
	// leave them paused while the tests behind them hold every place.
	strict bool
}

type slotWaiter struct {
	class        torchClass
	seconds, seq int
	arrived      bool // resumed by Go, waiting in run
}

func newSlotQueue(n int) *slotQueue {
	q := &slotQueue{free: n, holding: map[torchClass]int{}, strict: true}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// before reports whether a goes before b.
func (a *slotWaiter) before(b *slotWaiter) bool {
	if a.seconds != b.seconds {
		return a.seconds > b.seconds
	}
	return a.seq < b.seq
}

// run registers t, calls t.Parallel, and holds one of q's slots until t
// ends.
func (q *slotQueue) run(t *testing.T, class torchClass) {
	t.Helper()
	secs, ok := torchSeconds[t.Name()]
	if root, _, _ := strings.Cut(t.Name(), "/"); !ok {
		if secs, ok = torchSeconds[root]; !ok {
			secs = torchSecondsDefault
		}
	}
	q.mu.Lock()
	q.seq++
	w := &slotWaiter{class: class, seconds: secs, seq: q.seq}
	i := 0
	for i < len(q.waiting) && q.waiting[i].before(w) {
		i++
	}
	q.waiting = append(q.waiting[:i], append([]*slotWaiter{w}, q.waiting[i:]...)...)
	q.mu.Unlock()

	t.Parallel()
	waited := time.Now()
	q.mu.Lock()
	w.arrived = true
	for !q.turn(w) {
		q.cond.Wait()
	}
	q.free--
	q.holding[class]++
	for i, o := range q.waiting {
		if o == w {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			break
		}
	}
	q.cond.Broadcast() // the next in the order may go too
	q.mu.Unlock()
	t.Logf("ran after %s waiting for a slot", time.Since(waited).Round(time.Millisecond))
	t.Cleanup(func() {
		q.mu.Lock()
		q.free++
		q.holding[class]--
		q.cond.Broadcast()
		q.mu.Unlock()
	})
}

// turn reports whether w, resumed, may take its slot now (q.mu held).
func (q *slotQueue) turn(w *slotWaiter) bool {
	if q.free < 1 || q.holding[apart(w.class)] > 0 {
		return false
	}
	for _, o := range q.waiting {
		if o == w {
			return true
		}
		if q.holding[apart(o.class)] > 0 {
			continue // o could not go now either: w may pass it
		}
		if q.strict || o.arrived {
			return false
		}
	}
	return true
}

// apart is the class that c never runs beside (torchPlain: none).
func apart(c torchClass) torchClass {
	switch c {
	case torchBusy:
		return torchBounded
	case torchBounded:
		return torchBusy
	}
	return -1
}

// plainBuild is the spotagent binary built once for the whole package,
// without the race detector; raceBuild is the same build with it. TestMain
// makes both before the tests run; under -short, where most tests skip, the
// first test that runs the agent makes the one it needs.
var plainBuild, raceBuild = agentBuild{name: "spotagent"}, agentBuild{name: "spotagent-race", flags: []string{"-race"}}

// agentBuild is one build of ./cmd/spotagent, made once, into buildDir.
type agentBuild struct {
	name  string
	flags []string
	once  sync.Once
	path  string
	err   error
}

// buildDir holds the agent builds (TestMain).
var buildDir string

// get builds the agent the first time and returns its path.
func (b *agentBuild) get() (string, error) {
	b.once.Do(func() {
		// The tag of the shipped build (Makefile TAGS).
		b.path = filepath.Join(buildDir, b.name)
		build := exec.Command("go", append(append([]string{"build", "-tags", "disable_grpc_modules"}, b.flags...), "-o", b.path, "./cmd/spotagent")...)
		build.Dir = repo
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build spotagent %v: %v\n%s", b.flags, err, out)
		}
	})
	return b.path, b.err
}

// raceAgentTests run the race-built agent (agentBin): the scenarios where
// the agent's goroutines overlap the most (a notice's checkpoint, a
// restore beside the loop, peer transfers, a job commit killed, floods of
// connections; retries through faults run -race in-process, cmd/spotagent
// TestStoreFault_AgentThroughFaults). The agent's packages also run
// -race in their unit tests (make test-go). The race-built agent made
// the CLI tests and TestRun_SigtermAndResume 4x slower on a loaded 2-core
// machine (its start alone takes 2.6x the CPU), so the rest run the plain
// build. This test binary itself runs without -race in make test-go
// (Makefile: under it, its in-process S3, GCS and fault proxy made
// TestStoreFault_CommitRetries, now pkg/checkpoint/commit's, 12x slower).
// SPOTAGENT_IT_RACE=1 runs every test on the race-built agent.
var raceAgentTests = map[string]bool{
	"TestNotice_Matrix":                          true,
	"TestDistributed_RestoreFromPeerReplica":     true,
	"TestDistributed_AgentKilledDuringJobCommit": true,
	// The flood tests' RSS bound is sized for the race build (docs/reliability.md).
	"TestFlood_PeerPort": true,
}

// agentBin is the agent binary test t runs: the race build for
// raceAgentTests (or every test under SPOTAGENT_IT_RACE=1), else the plain
// one.
func agentBin(t *testing.T) string {
	t.Helper()
	b := &plainBuild
	if root, _, _ := strings.Cut(t.Name(), "/"); raceAgentTests[root] || os.Getenv("SPOTAGENT_IT_RACE") != "" {
		b = &raceBuild
	}
	p, err := b.get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// repo is the repository root.
var repo string

// python is the trainers' interpreter: /usr/bin/python3 (torch 1.13), or
// $SPOTAGENT_TEST_PYTHON (make test-python runs the torch tests again with
// scripts/sid-python: torch 2.x).
var python = testPython()

// TestMain builds the agent and runs the tests. Every test here is end to
// end (real processes, real servers); `go test -short` skips those with a
// Python or PyTorch trainer (requirePython: torchrun, namespaces and the
// Kubernetes-order tests among them) and the floods, and runs the rest;
// `make test` (test-go) runs the full set. Every test touches nothing
// process-wide and calls parallel, parallelTorch, parallelBusy or
// parallelTorchBounded, whose slots bound how many run at once:
// -test.parallel is set high unless given. (A test that did not would run
// before all of them, alone, on the package's critical path.)
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	} else {
		torchQueue.strict = false
	}
	_, file, _, _ := runtime.Caller(0)
	repo = filepath.Dir(filepath.Dir(file))
	dir, err := os.MkdirTemp("", "spotagent-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// No spotagent or SDK started here asks the link-local metadata
	// address for credentials (tests that fake IMDS point at their fake).
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	// s3test's credentials and region are the same for every server, so
	// they are set once here, and this process's S3 clients name their
	// server's endpoint (all.Options.S3Endpoint): tests that start an S3
	// server set no environment and can run in parallel.
	for _, kv := range s3Creds {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	// The GCS client reads its server from the environment: one server
	// for the package, set here.
	gcs, err := gcstest.Start("spotagent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcs server:", err)
		os.Exit(1)
	}
	gcsShared = gcs
	os.Setenv("STORAGE_EMULATOR_HOST", gcs.Host)
	buildDir = dir
	if !testing.Short() {
		errs := make(chan error, 2)
		for _, b := range []*agentBuild{&plainBuild, &raceBuild} {
			go func() { _, err := b.get(); errs <- err }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}
	prewarmRefs()
	code := m.Run()
	gcs.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// prewarmRefs starts the torch tests' reference runs (ddpRef,
// torchExampleRef) in the background of a full run (no -run, no -short),
// from the start, beside the first tests: a torch test that needs one
// waits only for what is left of its run, instead of running it on the
// torch slots' chain, the package's longest.
func prewarmRefs() {
	if testing.Short() || flag.Lookup("test.run").Value.String() != "" {
		return
	}
	if _, err := os.Stat(python); err != nil {
		return // requirePython says so, test by test
	}
	go computeDDPRef()
	go torchExampleRun(matrixSteps)
}

// proc is a running spotagent with its output collected line by line.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []string
	drained bool // the output pipe reached EOF
	cond    *sync.Cond
	done    chan struct{}
	code    int
}

// start runs spotagent with args and extra environment.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(agentBin(t), args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	return startCmd(t, cmd)
}

// startCmd runs cmd with its output collected line by line.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.drained = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		// Wait returns once the last bytes were written to the pipe, which
		// the scanner may not have split into lines yet: done closes only
		// once every line is in p.lines, so that what a test reads of the
		// output after wait is all of it.
		<-scanned
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		p.mu.Lock()
		p.code = code
		p.cond.Broadcast()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", strings.Join(cmd.Args, " "), p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLine waits for a line matching re and returns its submatches.
func (p *proc) waitLine(re string, timeout time.Duration) []string {
	p.t.Helper()
	if m, err := p.findLine(re, timeout); err != nil {
		p.t.Fatal(err)
	} else {
		return m
	}
	return nil
}

func (p *proc) findLine(re string, timeout time.Duration) ([]string, error) {
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() })
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; ; {
		for ; i < len(p.lines); i++ {
			if m := rx.FindStringSubmatch(p.lines[i]); m != nil {
				return m, nil
			}
		}
		select {
		case <-p.done:
			// The output pipe may still hold lines: wait for it to drain.
			if p.drained {
				return nil, fmt.Errorf("%s exited without printing a line matching %q", p.cmd.Path, re)
			}
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no line matching %q within %s", re, timeout)
		}
		p.cond.Wait()
	}
}

// wait waits for exit and returns the exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("spotagent still running after %s", timeout)
	}
	return -1
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal: %v", err)
	}
}

// atoi parses a submatch.
func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// requirePython fails (never skips) when the trainer's interpreter, or
// torch for the PyTorch tests, is missing: `make test` installs them.
// Under -short it skips the test: a real trainer end to end.
func requirePython(t *testing.T, torch bool) {
	t.Helper()
	if testing.Short() {
		what := "a Python trainer"
		if torch {
			what = "PyTorch trainers"
		}
		t.Skipf("-short: runs %s end to end (make test runs it)", what)
	}
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s missing: run scripts/test-deps.sh", python)
	}
	if torch {
		if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
			t.Fatalf("python3-torch missing (run scripts/test-deps.sh): %v %s", err, out)
		}
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	if x, y := readFile(t, a), readFile(t, b); !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ:\n%s\n---\n%s", a, b, x, y)
	}
}
