package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"

	"github.com/spotagent/spotagent/internal/render"
)

func TestMain(m *testing.M) {
	child.RunGuardIfAsked() // the in-process `run` tests start trainers, each under a guard, as main does
	// Nothing here may ask the link-local metadata address for credentials.
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Exit(m.Run())
}

// cli runs spotagent ARGS in-process and returns its exit code, stdout
// and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

// testStore is a file store in a fresh directory holding one run: a
// committed checkpoint (step 42, id c42) and, with journal, a journal.
func testStore(t *testing.T, journal *journal.Journal) (cloud.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ckpt := t.TempDir()
	if err := os.WriteFile(filepath.Join(ckpt, "model.pt"), []byte("weights"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &commit.Committer{Store: st, RunID: "exp1"}
	if _, err := c.Commit(t.Context(), commit.Request{Dir: ckpt, ID: "c42", Step: 42, Reason: "periodic"}); err != nil {
		t.Fatal(err)
	}
	if journal != nil {
		putJournal(t, st, journal)
	}
	return st, "file://" + dir
}

func putJournal(t *testing.T, st cloud.Store, j *journal.Journal) {
	t.Helper()
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(t.Context(), checkpoint.JournalKey, bytes.NewReader(b), int64(len(b)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestCLI_HelpGroupsAndExample(t *testing.T) {
	code, out, _ := cli(t, "run", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "usage: spotagent run [flags] -- COMMAND") || !strings.HasPrefix(lines[1], "e.g.   spotagent run --store ") {
		t.Fatalf("help does not start with the usage and an example:\n%s", out)
	}
	// Every group in order, --store under "required:", no single-dash flag.
	last := -1
	for _, g := range []string{"required:", "notices:", "schedule:", "trainer:", "store tuning:", "watch ", "socket and security:", "output:"} {
		i := strings.Index(out, "\n"+g)
		if i < 0 || i < last {
			t.Fatalf("group %q missing or out of order:\n%s", g, out)
		}
		last = i
	}
	if !regexp.MustCompile(`required:\n\s+--store string `).MatchString(out) {
		t.Fatalf("--store is not shown as required:\n%s", out)
	}
	if regexp.MustCompile(`(?m)^\s+-[a-z][a-z]`).MatchString(out) {
		t.Fatalf("a single-dash long flag in the help:\n%s", out)
	}
	// Each command shows only the flags it uses.
	for _, c := range []string{"list", "history"} {
		_, out, _ := cli(t, c, "--help")
		for _, f := range []string{"--s3-part-size", "--s3-concurrency", "--gcs-chunk-size", "--cloud", "--interval"} {
			if strings.Contains(out, f) {
				t.Errorf("%s --help shows %s", c, f)
			}
		}
		if !strings.Contains(out, "--store") || !strings.Contains(out, "(env SPOTAGENT_STORE)") {
			t.Errorf("%s --help lacks --store and its environment variable:\n%s", c, out)
		}
	}
	// --kill-after signals the child's group: only run has one.
	if !regexp.MustCompile(`--kill-after duration +SIGTERM to SIGKILL for the trainer's process group`).MatchString(out) {
		t.Errorf("run --help: --kill-after not described as the child's SIGKILL delay:\n%s", out)
	}
	for _, c := range []string{"sidecar", "node"} {
		_, out, _ := cli(t, c, "--help")
		if !regexp.MustCompile(`--kill-after duration +run only: a sidecar or node agent has no child to signal`).MatchString(out) {
			t.Errorf("%s --help: --kill-after not said to do nothing without a child:\n%s", c, out)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, out, _ := cli(t, args...)
		if code != 0 || !strings.Contains(out, "\n  run ") || !strings.Contains(out, "\n  completion ") {
			t.Errorf("spotagent %s: exit %d:\n%s", args[0], code, out)
		}
	}
}

func TestCLI_VersionAndCompletion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := cli(t, args...)
		if code != 0 || out != "spotagent "+version+"\n" {
			t.Errorf("spotagent %s: exit %d, stdout %q, stderr %q", args[0], code, out, errOut)
		}
	}
	for shell, want := range map[string]string{"bash": "__start_spotagent", "zsh": "#compdef spotagent", "fish": "complete -c spotagent"} {
		code, out, _ := cli(t, "completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, no %q", shell, code, want)
		}
	}
	// The shell asks the binary; flag values complete from their lists.
	_, out, _ := cli(t, "__complete", "run", "--cloud", "")
	if !strings.Contains(out, "aws\n") || !strings.Contains(out, "none\n") {
		t.Fatalf("completion of --cloud:\n%s", out)
	}
}

// TestCLI_FlagSpelling: the environment variable sets a flag, the command
// line overrides it, and the single-dash spelling of older releases still
// works with a warning, without touching the trainer's own arguments.
func TestCLI_FlagSpelling(t *testing.T) {
	_, uri := testStore(t, nil)
	t.Setenv("SPOTAGENT_STORE", uri)
	if code, out, errOut := cli(t, "list"); code != 0 || !strings.Contains(out, "c42") {
		t.Fatalf("list with SPOTAGENT_STORE: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := cli(t, "list", "--store", filepath.Join(t.TempDir(), "none"))
	if code != 1 || !strings.Contains(errOut, "does not exist") {
		t.Fatalf("--store did not override SPOTAGENT_STORE: exit %d %s", code, errOut)
	}
	os.Unsetenv("SPOTAGENT_STORE")
	code, out, errOut := cli(t, "list", "-store", uri, "-log-level=warn")
	if code != 0 || !strings.Contains(out, "c42") || !strings.Contains(errOut, "single-dash long flags are deprecated") {
		t.Fatalf("list -store: exit %d\n%s%s", code, out, errOut)
	}
	root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
	run, _, _ := root.Find([]string{"run"})
	got := normalizeArgs(run, []string{"run", "-store", "-x", "-cloud", "none", "python3", "-store", "--", "-keep"}, &bytes.Buffer{})
	want := []string{"run", "--store", "-x", "--cloud", "none", "python3", "-store", "--", "-keep"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("normalizeArgs=%q, want %q", got, want)
	}
	if code, _, errOut := cli(t, "status", "-x"); code != 2 || errOut == "" {
		t.Fatalf("status -x: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("SPOTAGENT_KEEP", "many")
	if code, _, errOut := cli(t, "run", "--store", uri, "--", "true"); code != 2 || !strings.Contains(errOut, `SPOTAGENT_KEEP="many"`) {
		t.Fatalf("bad SPOTAGENT_KEEP: exit %d, stderr %q", code, errOut)
	}
}

// TestCLI_ValidateBeforeStore: every flag is checked before the store is
// opened (or created) or the network touched; bad usage exits 2.
func TestCLI_ValidateBeforeStore(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--cloud", "nonee"}, `--cloud "nonee"`},
		{[]string{"run", "--watch-prune"}, "need --watch DIR"},
		{[]string{"run", "--interval", "soon"}, "--interval"},
		{[]string{"run", "--socket-mode", "999"}, "--socket-mode"},
		{[]string{"run", "--allow-uid", "x"}, "--allow-uid"},
		{[]string{"run", "--log-format", "xml"}, "--log-format"},
		{[]string{"run", "--watch", "d", "--watch-step-regex", "("}, "--watch-step-regex"},
		{[]string{"sidecar", "--on-rebalance", "maybe"}, "--on-rebalance"},
		{[]string{"report", "--format", "csv"}, "--format"},
		{[]string{"restore"}, "--dest is required"},
		// Issue 36 item 10: these were accepted.
		{[]string{"run", "--term-grace", "-5s"}, "--term-grace -5s: want a positive duration"},
		{[]string{"sidecar", "--term-grace", "0s"}, "--term-grace 0s: want a positive duration"},
		{[]string{"run", "--kill-after", "-1s"}, "--kill-after -1s: want a positive duration"},
		// A new user's trial: 0 was accepted and meant the default, 5 s.
		{[]string{"run", "--kill-after", "0"}, "--kill-after 0s: want a positive duration"},
		{[]string{"run", "--interruption-rate", "-1"}, "--interruption-rate -1: want a number >= 0"},
		{[]string{"run", "--interruption-rate", "NaN"}, "--interruption-rate NaN: want a number >= 0"},
		{[]string{"run", "--min-interval", "2h", "--max-interval", "1m"}, "--min-interval 2h0m0s is longer than --max-interval 1m0s"},
		{[]string{"run", "--min-interval", "0s"}, "--min-interval 0s: want a positive duration"},
		{[]string{"run", "--margin", "-1s"}, "--margin -1s: must not be negative"},
		{[]string{"report", "--price-per-hour", "-1"}, "--price-per-hour -1: want a number >= 0"},
		{[]string{"report", "--on-demand-price-per-hour", "-2"}, "--on-demand-price-per-hour -2: want a number >= 0"},
		{[]string{"report", "--min-interval", "2h", "--max-interval", "1m"}, "--min-interval 2h0m0s is longer than --max-interval 1m0s"},
		{[]string{"report", "--interruption-rate", "-1"}, "--interruption-rate -1"},
		{[]string{"report", "--advice-horizon", "0s"}, "--advice-horizon 0s"},
		{[]string{"fleet", "--since", "30x"}, `--since "30x": want a duration (36h) or days (30d)`},
		{[]string{"fleet", "--price-per-hour", "-1"}, "--price-per-hour -1: want a number >= 0"},
		{[]string{"run", "--fleet", "ftp://host/x"}, "--fleet: "},
		{[]string{"sidecar", "--fleet", "s3://B/x"}, "--fleet: "},
		// The review's item 2: these were accepted, and failed once the job ran.
		{[]string{"run", "--node-rank", "0", "--peer-timeout", "1ms"}, "--peer-timeout 1ms: want at least 2s"},
		{[]string{"sidecar", "--node-rank", "1", "--peer-timeout", "1.5s"}, "--peer-timeout 1.5s: want at least 2s"},
		{[]string{"run", "--node-rank", "0", "--peer-listen", "garbage"}, `--peer-listen "garbage": want HOST:PORT`},
		{[]string{"run", "--node-rank", "0", "--peer-listen", "1.2.3.4:99999"}, `--peer-listen "1.2.3.4:99999": want HOST:PORT or :PORT with a port from 0 to 65535`},
		{[]string{"run", "--node-rank", "0", "--peer-listen", ":http"}, `--peer-listen ":http"`},
		{[]string{"run", "--node-rank", "0", "--peer-advertise", "10.0.0.1:29450"}, "--peer-advertise \"10.0.0.1:29450\": want comma-separated hosts"},
		{[]string{"run", "--peer-timeout", "10s"}, "need --node-rank"},
		{[]string{"sidecar", "--peer-listen", ":29450"}, "need --node-rank"},
		{[]string{"run", "--peer-advertise", "10.0.0.1"}, "need --node-rank"},
		{[]string{"run", "--peer-restore"}, "--peer-restore needs --node-rank"},
		{[]string{"run", "--node-rank", "0", "--replicas", "1"}, "--replicas needs --peer-restore"},
		{[]string{"run", "--node-rank", "0", "--peer-restore", "--replicas", "2"}, "--replicas 2: want 0 or 1"},
		{[]string{"run", "--node-rank", "0", "--peer-restore", "--replicas", "1", "--local-keep", "0"}, "--replicas needs --local-keep 1"},
		{[]string{"sidecar", "--node-rank", "1", "--peer-restore", "--watch", "/tmp/x"}, "--peer-restore does not work with --watch"},
		{[]string{"run", "--node-rank", "0", "--peer-wait", "5s"}, "--peer-wait needs --peer-restore"},
		{[]string{"sidecar", "--node-rank", "1", "--peer-restore", "--peer-wait", "-1s"}, "--peer-wait must not be negative"},
	} {
		store := filepath.Join(t.TempDir(), "store")
		args := append(tc.args, "--store", store)
		if tc.args[0] == "run" {
			args = append(args, "--", "true")
		}
		code, _, errOut := cli(t, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line naming %q", tc.args, code, errOut, tc.want)
		}
		if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%v: the store was touched before the flags were checked", tc.args)
		}
	}
}

// TestCLI_NodePeerFlags: node mode takes the heartbeat flags without
// --node-rank (it hosts every node rank that connects) and checks them as
// run and sidecar do, before the store prefix is touched (#37).
func TestCLI_NodePeerFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--peer-timeout", "1s"}, "--peer-timeout 1s: want at least 2s"},
		{[]string{"--peer-listen", "garbage"}, `--peer-listen "garbage": want HOST:PORT`},
		{[]string{"--peer-listen", ":70000"}, `--peer-listen ":70000": want HOST:PORT or :PORT with a port from 0 to 65535`},
		{[]string{"--peer-advertise", "10.0.0.1:29450"}, "--peer-advertise \"10.0.0.1:29450\": want comma-separated hosts"},
		{[]string{"--replicas", "1"}, "--replicas needs --peer-restore"},
		{[]string{"--peer-restore", "--replicas", "1", "--local-keep", "0"}, "--replicas needs --local-keep 1"},
		{[]string{"--peer-wait", "0s"}, "--peer-wait needs --peer-restore"},
	} {
		store := filepath.Join(t.TempDir(), "store")
		args := append([]string{"node", "--store-prefix", "file://" + store, "--checkpoint-root", t.TempDir()}, tc.args...)
		code, _, errOut := cli(t, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line naming %q", tc.args, code, errOut, tc.want)
		}
		if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%v: the store was touched before the flags were checked", tc.args)
		}
	}
}

// TestCLI_ReadOnlyStore: list, history, report and restore never create
// a store; one that does not exist, holds nothing, or lacks what the
// command reads exits 1 with one line naming it.
func TestCLI_ReadOnlyStore(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexistent", "bucket")
	empty := t.TempDir()
	_, noJournal := testStore(t, nil)
	noCkpt := filepath.Join(t.TempDir(), "run")
	st, err := file.New(noCkpt)
	if err != nil {
		t.Fatal(err)
	}
	putJournal(t, st, sampleJournal())
	for _, c := range [][]string{{"list"}, {"history"}, {"report"}, {"restore", "--dest", filepath.Join(t.TempDir(), "d")}} {
		for _, tc := range []struct{ store, want string }{
			{"file://" + missing, "directory " + missing + " does not exist"},
			{missing, "does not exist"},
			{empty, "holds nothing: no run has used this store"},
		} {
			code, out, errOut := cli(t, append(c, "--store", tc.store)...)
			if code != 1 || !strings.Contains(errOut, tc.want) || out != "" {
				t.Errorf("%s --store %s: exit %d, stdout %q, stderr %q; want 1 and %q", c[0], tc.store, code, out, errOut, tc.want)
			}
		}
		if _, err := os.Stat(filepath.Dir(missing)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s created %s", c[0], filepath.Dir(missing))
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"history", "--store", noJournal}, 1, "no run journal in"},
		{[]string{"report", "--store", noJournal}, 1, "no run journal in"},
		{[]string{"list", "--store", noJournal}, 0, ""},
		{[]string{"list", "--store", noCkpt}, 1, "no checkpoints in"},
		{[]string{"restore", "--store", noCkpt, "--dest", filepath.Join(t.TempDir(), "d")}, 1, "no complete checkpoint in"},
		{[]string{"history", "--store", noCkpt}, 0, ""},
	} {
		code, _, errOut := cli(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestCLI_RestoreUnknownID(t *testing.T) {
	_, uri := testStore(t, nil)
	dest := filepath.Join(t.TempDir(), "d")
	code, _, errOut := cli(t, "restore", "--store", uri, "--dest", dest, "--id", "nosuch")
	if code != 1 || !strings.Contains(errOut, `no checkpoint with id "nosuch"`) || !strings.Contains(errOut, "spotagent list --store") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a restore of an unknown id created --dest")
	}
	if code, out, errOut := cli(t, "restore", "--store", uri, "--dest", dest, "--id", "c42"); code != 0 || !strings.Contains(out, "restored step 42") {
		t.Fatalf("restore --id c42: exit %d\n%s%s", code, out, errOut)
	}
}

// TestLogConfig: one line; at info level only the flags that were set,
// at debug level every flag.
func TestLogConfig(t *testing.T) {
	cmd := newRunCmd()
	t.Setenv("SPOTAGENT_KEEP", "7")
	if err := applyEnv(cmd); err != nil {
		t.Fatal(err)
	}
	// An endpoint's password is never logged (a hostile-user trial found
	// it in this line).
	if err := cmd.Flags().Parse([]string{"--store", "s3://b/x", "--cloud", "none",
		"--s3-endpoint", "http://ep-user:EndpointPassword77@127.0.0.1:18080", "--", "true"}); err != nil {
		t.Fatal(err)
	}
	for _, level := range []zapcore.Level{zap.InfoLevel, zap.DebugLevel} {
		core, logs := observer.New(level)
		logConfig(zap.New(core), cmd.Flags())
		entries := logs.FilterMessage("effective configuration").All()
		if len(entries) != 1 {
			t.Fatalf("%s: %d lines, want 1", level, len(entries))
		}
		f := entries[0].ContextMap()
		if f["store"] != "s3://b/x" || f["cloud"] != "none" || f["keep"] != "7" {
			t.Fatalf("%s: fields %v lack what was set", level, f)
		}
		if ep := f["s3-endpoint"]; ep != "http://ep-user:xxxxx@127.0.0.1:18080" {
			t.Fatalf("%s: s3-endpoint logged as %q, want its password replaced", level, ep)
		}
		_, hasDefault := f["margin"]
		if level == zap.InfoLevel && (hasDefault || len(f) != 5) {
			t.Fatalf("info: fields %v, want only store, cloud, s3-endpoint, keep and the note", f)
		}
		if level == zap.DebugLevel && (!hasDefault || entries[0].Level != zap.DebugLevel) {
			t.Fatalf("debug: fields %v at %s, want every flag at debug", f, entries[0].Level)
		}
	}
}

func sampleJournal() *journal.Journal {
	t0 := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	end := t0.Add(time.Hour)
	deadline := t0.Add(2 * time.Hour)
	zero := 0
	return &journal.Journal{
		Format: "spotagent-journal/1", RunID: "exp1",
		Sessions: []journal.Session{{Start: t0, End: &end, ExitCode: &zero}},
		Interruptions: []journal.Interruption{{Cloud: "aws", Kind: "termination", Detected: t0.Add(30 * time.Minute),
			Deadline: &deadline, CommitOK: false, Error: "deadline"}},
	}
}

// TestHistory_Rows: no empty RESTORE table, "-" for what a failed
// interruption never saved, a NODE column when the restores were a
// multi-node job's.
func TestHistory_Rows(t *testing.T) {
	j := sampleJournal()
	var b bytes.Buffer
	render.Journal(&b, j)
	out := b.String()
	if strings.Contains(out, "RESTORE") || !strings.Contains(out, "no restores") {
		t.Fatalf("an empty RESTORE table:\n%s", out)
	}
	row := strings.Fields(strings.Split(out, "\n")[3])
	if !strings.Contains(strings.Join(row, " "), " - - NO: deadline") {
		t.Fatalf("failed row %q: want STEP and BYTES '-'\n%s", row, out)
	}
	at := time.Date(2026, 5, 4, 11, 0, 0, 0, time.UTC)
	j.Restores = []journal.RestoreEntry{{At: at, CheckpointID: "a1", Step: 10, Node: "node-0"}, {At: at, CheckpointID: "a1", Step: 10, Node: "node-1"}}
	b.Reset()
	render.Journal(&b, j)
	if out := b.String(); !strings.Contains(out, "NODE") || !strings.Contains(out, "node-0") || !strings.Contains(out, "node-1") {
		t.Fatalf("restores of two nodes without a NODE column:\n%s", out)
	}
}

// TestHistory_LostSteps: the LOST column says how the steps were counted
// when the trainer did not report them (zero-code mode).
func TestHistory_LostSteps(t *testing.T) {
	for _, c := range []struct{ from, want string }{
		{"", "(49 steps)"},
		{journal.LostFromEstimate, "(~49 steps, estimated)"},
		{journal.LostFromDir, "(at least 49 steps, seen in DIR)"},
	} {
		j := sampleJournal()
		j.Interruptions[0].LostSteps, j.Interruptions[0].LostStepsFrom = 49, c.from
		var b bytes.Buffer
		render.Journal(&b, j)
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("lost_steps_from %q: want %q in\n%s", c.from, c.want, b.String())
		}
	}
}

func TestReport_EndedBy(t *testing.T) {
	j := sampleJournal()
	j.Interruptions = nil
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := render.Report(&b, j, g, nil, "", nil, 0, 0, "table"); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^1 .* finished\s*$`).MatchString(b.String()) {
		t.Fatalf("a session that finished is not ended by \"finished\":\n%s", b.String())
	}
}

// TestHistory_CrashedTrainer: a session whose trainer crashed at once is
// time on machines with nothing kept, and its trainer failed, never
// "3s trained" or "finished" (#47).
func TestHistory_CrashedTrainer(t *testing.T) {
	start := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	end, code := start.Add(3*time.Second), 1
	j := &journal.Journal{Format: journal.Format, RunID: "crash",
		Sessions: []journal.Session{{Start: start, End: &end, ExitCode: &code}}}
	j.Stats.RunSeconds = 3
	var b strings.Builder
	render.Journal(&b, j)
	if out := b.String(); strings.Contains(out, "trained") || !strings.Contains(out, "3s on machines (none of it kept: no checkpoint committed)") {
		t.Errorf("history of a crashed trainer:\n%s", out)
	}
	g, err := journal.Account(j, end)
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := render.Report(&b, j, g, nil, "", nil, 0, 0, "table"); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "trainer failed (exit 1)") || strings.Contains(out, "finished") {
		t.Errorf("report of a crashed trainer:\n%s", out)
	}
}

// TestCLI_ReadOnlyS3NoIMDS: with credentials in the environment, a read of
// an S3 store asks the metadata service nothing, even when allowed to.
func TestCLI_ReadOnlyS3NoIMDS(t *testing.T) {
	var asked atomic.Int64
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Error(w, "no", http.StatusNotFound)
	}))
	defer imds.Close()
	s3 := s3test.New(t)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "false")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		if k != "AWS_EC2_METADATA_DISABLED" {
			t.Setenv(k, v)
		}
	}
	code, _, errOut := cli(t, "list", "--store", "s3://"+s3.Bucket+"/runs/none")
	if code != 1 || !strings.Contains(errOut, "holds nothing") {
		t.Fatalf("list of an empty prefix: exit %d, stderr %q", code, errOut)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the metadata service was asked %d times", n)
	}
}

// TestRestore_ProgressLog: not on a terminal, a transfer logs structured
// progress lines: the checkpoint's bytes and files read so far, of the
// total, and the rate. Manifests and latest.json do not count.
func TestRestore_ProgressLog(t *testing.T) {
	st, _ := testStore(t, nil)
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = time.Millisecond
	cs := &countingStore{Store: st}
	core, logs := observer.New(zap.InfoLevel)
	stop := showProgress(cs, "restore", 7, 1, &bytes.Buffer{}, zap.New(core))
	defer stop()
	entries, err := checkpoint.ListManifests(t.Context(), cs)
	if err != nil || len(entries) != 1 {
		t.Fatalf("entries %v, err %v", entries, err)
	}
	for _, f := range entries[0].Manifest.Files {
		r, err := cs.Get(t.Context(), f.Key, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r)
		r.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, e := range logs.FilterMessage("restore progress").All() {
			f := e.ContextMap()
			if f["bytes"] == int64(7) && f["total"] == int64(7) && f["files"] == int64(1) && f["total_files"] == int64(1) {
				if _, ok := f["mb_per_s"]; ok {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress line with 7 of 7 bytes, 1 of 1 files: %v", logs.All())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBusy: a read of a store that takes longer than busyAfter says so
// (not on a terminal: a log line every progressEvery), and list's table
// still comes whole.
func TestBusy(t *testing.T) {
	defer func(d, e time.Duration) { busyAfter, progressEvery = d, e }(busyAfter, progressEvery)
	busyAfter, progressEvery = 0, time.Millisecond
	core, logs := observer.New(zap.InfoLevel)
	stop := busy(&bytes.Buffer{}, "reading s", zap.New(core))
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessage("reading s").Len() < 2 {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("no busy lines: %v", logs.All())
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	_, uri := testStore(t, nil)
	code, out, _ := cli(t, "list", "--store", uri)
	if code != 0 || !strings.HasPrefix(out, "STEP") || !strings.Contains(out, "c42") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

// TestCLI_UnknownHelpTopicAndShell (issue 36 item 10): `completion tcsh`
// and `help bogus` printed a help and exited 0; they are bad usage now.
func TestCLI_UnknownHelpTopicAndShell(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"completion", "tcsh"}, 2, `unknown shell "tcsh": want bash, zsh, fish or powershell`},
		{[]string{"completion"}, 2, "which shell?"},
		{[]string{"help", "bogus"}, 2, `unknown command "bogus"`},
		{[]string{"help", "run", "extra"}, 2, `unknown command "run extra"`},
		{[]string{"help"}, 0, ""},
		{[]string{"help", "run"}, 0, ""},
		{[]string{"completion", "bash"}, 0, ""},
	} {
		code, out, errOut := cli(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
		if code == 0 && out == "" {
			t.Errorf("%v: nothing printed", tc.args)
		}
	}
}

// TestCLI_EnvNamedInError (issue 41): a bad value from the environment
// names its variable, not only the flag the user never typed.
func TestCLI_EnvNamedInError(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	t.Setenv("SPOTAGENT_INTERVAL", "5")
	code, _, errOut := cli(t, "report", "--store", store)
	if code != 2 || !strings.Contains(errOut, `SPOTAGENT_INTERVAL="5": --interval: want auto or a positive duration`) {
		t.Fatalf("exit %d, stderr %q; want 2 naming SPOTAGENT_INTERVAL", code, errOut)
	}
	t.Setenv("SPOTAGENT_TERM_GRACE", "-5s")
	code, _, errOut = cli(t, "run", "--store", store, "--interval", "auto", "--", "true")
	if code != 2 || !strings.Contains(errOut, `SPOTAGENT_TERM_GRACE="-5s": --term-grace -5s`) {
		t.Fatalf("exit %d, stderr %q; want 2 naming SPOTAGENT_TERM_GRACE", code, errOut)
	}
	// Given on the command line, the flag is named alone.
	code, _, errOut = cli(t, "run", "--store", store, "--interval", "auto", "--term-grace", "-1s", "--", "true")
	if code != 2 || strings.Contains(errOut, "SPOTAGENT_TERM_GRACE") {
		t.Fatalf("exit %d, stderr %q; want 2 without the variable", code, errOut)
	}
	if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the store was touched")
	}
}

// TestCLI_RefusedSocketLeavesStoreAlone (review, item 1): a start the
// socket refuses (its default directory not the agent's 0700 one, or a
// live agent on it) exits 1 before the store is opened: a file:// store's
// directory is not even created, and no lease can fence the live agent.
func TestCLI_RefusedSocketLeavesStoreAlone(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("TMPDIR", tmp)
	if err := os.Mkdir(socketDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(socketDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(t.TempDir(), "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "want no group or other permissions"},
		{[]string{"--socket", live}, "in use by another live agent"},
	} {
		store := filepath.Join(t.TempDir(), "store")
		args := append(append([]string{"run", "--cloud", "none", "--store", store}, tc.args...), "--", "true")
		code, _, errOut := cli(t, args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 naming %q", tc.args, code, errOut, tc.want)
		}
		if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%v: the store was created by a start the socket refused", tc.args)
		}
	}
	// Nor does a trainer command that cannot start (exit 127, as shells).
	{
		store := filepath.Join(t.TempDir(), "store")
		code, _, errOut := cli(t, "run", "--cloud", "none", "--store", store, "--socket", filepath.Join(t.TempDir(), "a.sock"), "--", "no-such-trainer-xyz")
		if code != 127 || !strings.Contains(errOut, "no-such-trainer-xyz") {
			t.Errorf("missing trainer: exit %d, stderr %q; want 127 naming it", code, errOut)
		}
		if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
			t.Error("missing trainer: the store was created")
		}
	}
}

// TestCLI_SuggestsFlag: an unknown flag names the one meant, when one is
// near (cobra suggests commands, not flags), and exits 2.
func TestCLI_SuggestsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet", "--html"}, "spotagent fleet: unknown flag: --html (did you mean --format html?)\n"},
		{[]string{"run", "--stor", "x"}, "spotagent run: unknown flag: --stor (did you mean --store?)\n"},
		{[]string{"report", "--formt", "json"}, "spotagent report: unknown flag: --formt (did you mean --format?)\n"},
		{[]string{"fleet", "--zzzzzz"}, "spotagent fleet: unknown flag: --zzzzzz\n"},
	} {
		code, _, errOut := cli(t, tc.args...)
		if code != 2 || !strings.HasPrefix(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}
