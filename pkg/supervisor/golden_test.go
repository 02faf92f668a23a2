package supervisor

// Golden transcripts of the trainer protocol (testdata/golden/*.jsonl),
// replayed against a real Agent here and against python/tests/fakeagent.py
// by python/tests/test_golden.py: the Python stand-in cannot accept what the
// agent refuses (it once accepted a join without a deadline), because both
// must answer every transcript line for line.
//
// One JSON object per line:
//
//	{"golden": {"interval": "200ms", "node": 0}}   config (first line; node: part mode)
//	{"trainer": {...}}          the trainer sends this message
//	{"trainer_raw": "text"}     the trainer sends this line as is (garbage)
//	{"agent": {...}}            the agent's next line is this message: the answer
//	                            to the trainer's last line (the fake must make it)
//	{"agent": {...}, "own": true}  the agent's next line, on its own initiative
//	                            (a periodic request, after a signal or notice,
//	                            a stop): the Python replay injects it
//	{"do": "write", "dir": "$DIR", "file": "f", "data": "x"}  the trainer writes a file
//	{"do": "signal"}            SIGTERM to the agent
//	{"do": "notice", "in": "60s"}  an interruption notice due in that time
//	{"do": "restore"}           the restore running beside the trainer's
//	                            start ends (golden "restore": "pending" or
//	                            "fail": a committed checkpoint of step 7,
//	                            metadata {"epoch": 1}, whose restore waits
//	                            for this line, then completes or fails)
//	{"#": "..."}                a comment
//
// Placeholders in agent lines: "$ANY" matches any value, "$TIME" any RFC 3339
// time, "$NAME" binds on first sight and must be equal after, a string ending
// in "$*" matches any string with that prefix. In trainer lines "$NAME" is
// the bound value, "$PID" this process's pid, "$FUTURE" now + 30 s and
// "$PAST" a minute ago. An agent line's keys must be exactly the message's.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/schedule"
)

type goldenLine struct {
	Golden     *goldenConfig  `json:"golden"`
	Trainer    map[string]any `json:"trainer"`
	TrainerRaw *string        `json:"trainer_raw"`
	Agent      map[string]any `json:"agent"`
	Own        bool           `json:"own"`
	Do         string         `json:"do"`
	Dir        string         `json:"dir"`
	File       string         `json:"file"`
	Data       string         `json:"data"`
	In         string         `json:"in"`
	Comment    string         `json:"#"`
}

type goldenConfig struct {
	// Interval: the transcript's one periodic request is due this long
	// after the trainer's first line (default: none). The next would come
	// an hour after it: a transcript's line order never depends on how
	// fast a loaded machine replays it.
	Interval string `json:"interval"`
	Node     *int   `json:"node"` // part mode: this agent is node K of a job
	// Restore: "pending" or "fail": the agent restores while the trainer
	// starts (Config.OverlapRestore), from a store whose checkpoint's
	// files wait for {"do": "restore"}, then arrive or fail.
	Restore string `json:"restore"`
}

func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden transcripts (%v)", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".jsonl"), func(t *testing.T) {
			replayGolden(t, readGolden(t, f))
		})
	}
}

func readGolden(t *testing.T, path string) []goldenLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []goldenLine
	for i, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var g goldenLine
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber()
		d.DisallowUnknownFields()
		if err := d.Decode(&g); err != nil {
			t.Fatalf("%s:%d: %v", path, i+1, err)
		}
		lines = append(lines, g)
	}
	if len(lines) == 0 || lines[0].Golden == nil {
		t.Fatalf("%s: the first line must be {\"golden\": {...}}", path)
	}
	return lines
}

func replayGolden(t *testing.T, lines []goldenLine) {
	cfg := lines[0].Golden
	var interval time.Duration
	if cfg.Interval != "" {
		d, err := time.ParseDuration(cfg.Interval)
		if err != nil {
			t.Fatal(err)
		}
		interval = d
	}
	// Periodic checkpoints an hour apart; the transcript's one periodic
	// request comes from a maintenance window set as the trainer sends its
	// first line (askPeriodic). A fixed interval of 200 ms instead asked
	// again 200 ms after each done: on a loaded machine that request
	// overtook the answer to the trainer's next line.
	sched := schedule.NewScheduler(schedule.SchedulerConfig{Min: time.Hour, Max: time.Hour})
	askPeriodic := func() {
		// The window's checkpoint is due its commit time before it: the
		// default cost, as no checkpoint has been measured yet. Once the
		// trainer has finished one after that, the window asks no more.
		now := time.Now()
		sched.Hazard(now, "maintenance", now.Add(interval+schedule.DefaultCost))
		interval = 0
	}
	src := noticetest.New(1)
	var gated *gatedStore
	if cfg.Restore != "" {
		gated = newGatedStore(t, cfg.Restore == "fail")
	}
	ar := startAgentErr(t, func(c *Config) {
		c.Scheduler = sched
		c.Source = src
		if cfg.Node != nil {
			c.Node = NodePart(*cfg.Node)
		}
		if gated != nil {
			c.Store, c.OverlapRestore = gated, true
		}
	}, cfg.Restore == "fail")
	conn := dialGolden(t, ar.cfg.Server.Path)
	in := make(chan string, 64)
	go func() {
		defer close(in)
		r := bufio.NewReaderSize(conn, 2<<20)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			in <- strings.TrimSpace(l)
		}
	}()
	vars := map[string]any{}
	for i, g := range lines[1:] {
		where := fmt.Sprintf("line %d", i+2)
		switch {
		case g.Trainer != nil:
			if interval > 0 {
				askPeriodic() // before the line that wakes the agent's loop to see it
			}
			b, err := json.Marshal(substituteGolden(g.Trainer, vars))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			sendGolden(t, conn, string(b))
		case g.TrainerRaw != nil:
			sendGolden(t, conn, *g.TrainerRaw)
		case g.Agent != nil:
			var got string
			select {
			case l, ok := <-in:
				if !ok {
					t.Fatalf("%s: connection closed, want %v", where, g.Agent)
				}
				got = l
			case <-time.After(testutil.Wait):
				t.Fatalf("%s: no line from the agent, want %v", where, g.Agent)
			}
			var m map[string]any
			d := json.NewDecoder(strings.NewReader(got))
			d.UseNumber()
			if err := d.Decode(&m); err != nil {
				t.Fatalf("%s: agent sent %q: %v", where, got, err)
			}
			if err := matchGolden(g.Agent, m, vars, ""); err != nil {
				t.Fatalf("%s: agent sent %s\nwant %v\n%v", where, got, g.Agent, err)
			}
		case g.Do == "write":
			dir, ok := vars[strings.TrimPrefix(g.Dir, "$")].(string)
			if !ok {
				t.Fatalf("%s: %s is not bound to a directory", where, g.Dir)
			}
			if err := os.WriteFile(filepath.Join(dir, g.File), []byte(g.Data), 0o600); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		case g.Do == "restore":
			if gated == nil {
				t.Fatalf("%s: restore without golden \"restore\"", where)
			}
			gated.release()
		case g.Do == "signal":
			ar.sigs <- syscall.SIGTERM
		case g.Do == "notice":
			d, err := time.ParseDuration(g.In)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			now := time.Now()
			src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "golden",
				Action: "terminate", Deadline: now.Add(d), Detected: now}
		case g.Comment != "":
		default:
			t.Fatalf("%s: nothing to do", where)
		}
	}
}

func dialGolden(t *testing.T, path string) net.Conn {
	t.Helper()
	deadline := time.Now().Add(testutil.Wait)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %s: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the socket to appear, bounded by deadline
	}
}

func sendGolden(t *testing.T, c net.Conn, line string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(testutil.Wait))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
}

var goldenVar = regexp.MustCompile(`^\$[A-Z][A-Z0-9_]*$`)

// substituteGolden replaces placeholders in a trainer line.
func substituteGolden(v any, vars map[string]any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = substituteGolden(e, vars)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = substituteGolden(e, vars)
		}
		return out
	case string:
		switch {
		case x == "$PID":
			return os.Getpid()
		case x == "$FUTURE":
			return time.Now().Add(30 * time.Second).UTC().Format(time.RFC3339Nano)
		case x == "$PAST":
			return time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
		case goldenVar.MatchString(x):
			if b, ok := vars[x[1:]]; ok {
				return b
			}
		}
	}
	return v
}

// matchGolden checks got against the expected value want, binding variables.
func matchGolden(want, got any, vars map[string]any, path string) error {
	if s, ok := want.(string); ok {
		switch {
		case s == "$ANY":
			return nil
		case s == "$TIME":
			g, ok := got.(string)
			if _, err := time.Parse(time.RFC3339Nano, g); !ok || err != nil {
				return fmt.Errorf("%s: %v is not an RFC 3339 time", path, got)
			}
			return nil
		case strings.HasSuffix(s, "$*"):
			g, ok := got.(string)
			if !ok || !strings.HasPrefix(g, strings.TrimSuffix(s, "$*")) {
				return fmt.Errorf("%s: %v does not start with %q", path, got, strings.TrimSuffix(s, "$*"))
			}
			return nil
		case goldenVar.MatchString(s):
			name := s[1:]
			if b, ok := vars[name]; ok {
				if !reflect.DeepEqual(b, got) {
					return fmt.Errorf("%s: %v, want %s = %v", path, got, s, b)
				}
				return nil
			}
			vars[name] = got
			return nil
		}
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", path, got)
		}
		if wk, gk := goldenKeys(w), goldenKeys(g); !reflect.DeepEqual(wk, gk) {
			return fmt.Errorf("%s: keys %v, want %v", path, gk, wk)
		}
		for k, e := range w {
			if err := matchGolden(e, g[k], vars, path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: %v, want %v", path, got, want)
		}
		for i := range w {
			if err := matchGolden(w[i], g[i], vars, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if !reflect.DeepEqual(want, got) {
		return fmt.Errorf("%s: %v (%T), want %v (%T)", path, got, got, want, want)
	}
	return nil
}

func goldenKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// gatedStore holds a committed checkpoint of step 7 (two files): the
// restore's first file arrives, the second waits for release, then arrives
// or (fail) fails half-way with a store error.
type gatedStore struct {
	cloud.Store
	gate     chan struct{}
	fail     bool
	mu       sync.Mutex
	released bool
	gets     int
}

func newGatedStore(t *testing.T, fail bool) *gatedStore {
	t.Helper()
	st, err := file.New(filepath.Join(testutil.ShortDir(t), "store"))
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	for name, body := range map[string]string{"a.bin": "first file", "b.bin": "second file"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &commit.Committer{Store: st, RunID: "test"}
	if _, err := c.Commit(t.Context(), commit.Request{Dir: src, ID: "60d0000000a7", Step: 7, Metadata: json.RawMessage(`{"epoch":1}`)}); err != nil {
		t.Fatal(err)
	}
	return &gatedStore{Store: st, gate: make(chan struct{}), fail: fail}
}

func (g *gatedStore) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.released {
		g.released = true
		close(g.gate)
	}
}

func (g *gatedStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if strings.HasSuffix(key, ".bin") {
		g.mu.Lock()
		g.gets++
		first := g.gets == 1
		g.mu.Unlock()
		if !first {
			select {
			case <-g.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if g.fail {
				return nil, errors.New("connection reset by peer")
			}
		}
	}
	return g.Store.Get(ctx, key, off, n)
}
