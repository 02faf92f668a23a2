package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// victimEnv makes the test binary a crash victim instead of a test run:
// it commits checkpoints in a loop until it is killed (see runVictim).
const victimEnv = "SPOTAGENT_CRASH_VICTIM"

func init() {
	if cfg := os.Getenv(victimEnv); cfg != "" {
		os.Exit(runVictim(cfg))
	}
}

// victimConfig is what the parent hands a victim, as JSON in victimEnv.
type victimConfig struct {
	Store    string `json:"store"`
	Endpoint string `json:"endpoint"` // S3 endpoint override
	Trial    int    `json:"trial"`
	Start    int64  `json:"start"` // first step
	Keep     int    `json:"keep"`
	Scratch  string `json:"scratch"`
}

// runVictim commits checkpoint after checkpoint, as the agent does
// (Commit, then Prune), printing "latest written step N" once Commit
// returned, i.e. after latest.json was written.
func runVictim(raw string) int {
	var cfg victimConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "victim config:", err)
		return 2
	}
	ctx := context.Background()
	st, err := all.Open(ctx, cfg.Store, all.Options{S3Endpoint: cfg.Endpoint, S3PartSize: 5 << 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, "victim:", err)
		return 2
	}
	c := &commit.Committer{Store: st, RunID: "crash"}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	for step := cfg.Start; ; step++ {
		id := fmt.Sprintf("t%d-s%d", cfg.Trial, step)
		dir := filepath.Join(cfg.Scratch, id)
		if err := writeCheckpoint(dir, id, step); err != nil {
			fmt.Fprintln(os.Stderr, "victim:", err)
			return 2
		}
		if _, err := c.Commit(ctx, commit.Request{Dir: dir, ID: id, Step: step, Reason: "periodic"}); err != nil {
			fmt.Fprintln(os.Stderr, "victim: commit:", err)
			return 3
		}
		fmt.Fprintf(out, "latest written step %d\n", step)
		out.Flush()
		if _, err := checkpoint.Prune(ctx, st, cfg.Keep, nil); err != nil {
			fmt.Fprintln(os.Stderr, "victim: prune:", err)
			return 3
		}
		os.RemoveAll(dir)
	}
}

// checkpointFiles is the content a victim writes for (id, step): the
// parent regenerates it to check a restore byte for byte. One file in
// three is large enough for a multipart upload (5 MiB parts).
func checkpointFiles(id string, step int64) map[string][]byte {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(step)))
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], rng.Uint64())
	binary.LittleEndian.PutUint64(seed[8:], rng.Uint64())
	src := rand.NewChaCha8(seed)
	files := map[string][]byte{}
	n := 1 + rng.IntN(4)
	for i := range n {
		size := rng.IntN(64 << 10)
		if i == 0 && rng.IntN(3) == 0 {
			size = 5<<20 + rng.IntN(3<<20)
		}
		b := make([]byte, size)
		src.Read(b)
		name := fmt.Sprintf("f%d.bin", i)
		if i == 2 {
			name = "sub/opt.bin"
		}
		files[name] = b
	}
	files["step.json"] = []byte(fmt.Sprintf(`{"id":%q,"step":%d}`, id, step))
	return files
}

func writeCheckpoint(dir, id string, step int64) error {
	for name, b := range checkpointFiles(id, step) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// checkRestoredFiles compares a restored directory with what the victim
// wrote for (id, step): the same names, the same bytes, nothing else.
func checkRestoredFiles(dir, id string, step int64) error {
	want := checkpointFiles(id, step)
	got := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		got[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		return err
	}
	if len(got) != len(want) {
		return fmt.Errorf("restored %d files, the checkpoint had %d", len(got), len(want))
	}
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			return fmt.Errorf("%s: restored %d bytes differ from the %d written", name, len(got[name]), len(b))
		}
	}
	return nil
}

// victim is a running crash victim.
type victim struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	ready  bool
	latest int64 // newest "latest written step", -1 before any
	stamps []time.Time
	done   chan struct{}
	stderr bytes.Buffer
}

var latestLine = regexp.MustCompile(`^latest written step (\d+)$`)

func startVictim(t *testing.T, cfg victimConfig, env []string) *victim {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	v := &victim{latest: -1, done: make(chan struct{})}
	v.cmd = exec.Command(self)
	v.cmd.Env = append(append(os.Environ(), env...), victimEnv+"="+string(raw))
	v.cmd.Stderr = &v.stderr
	out, err := v.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			v.mu.Lock()
			if sc.Text() == "ready" {
				v.ready = true
			} else if m := latestLine.FindStringSubmatch(sc.Text()); m != nil {
				v.latest, _ = strconv.ParseInt(m[1], 10, 64)
				v.stamps = append(v.stamps, time.Now())
			}
			v.mu.Unlock()
		}
		v.cmd.Wait()
		close(v.done)
	}()
	return v
}

// waitReady waits for the victim's "ready" (store opened).
func (v *victim) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		v.mu.Lock()
		ok := v.ready
		v.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-v.done:
			return fmt.Errorf("victim exited before it was ready: %s", v.stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("victim not ready in time")
		}
	}
}

// kill SIGKILLs the victim and returns the newest step it reported as
// written before it died, and the number of commits it completed.
func (v *victim) kill() (latest int64, commits int, err error) {
	v.cmd.Process.Signal(syscall.SIGKILL)
	<-v.done
	v.mu.Lock()
	defer v.mu.Unlock()
	if ws, ok := v.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		return v.latest, len(v.stamps), fmt.Errorf("victim exited on its own (%v): %s", v.cmd.ProcessState, v.stderr.String())
	}
	return v.latest, len(v.stamps), nil
}

// leftovers counts what a crashed writer leaves in a store: temp files of
// the file store, incomplete multipart uploads under an S3 store's prefix.
func leftovers(ctx context.Context, st cloud.Store, root string) (int, error) {
	names, err := leftoverNames(ctx, st, root)
	return len(names), err
}

// leftoverNames names them: temp file paths, or "key upload-id".
func leftoverNames(ctx context.Context, st cloud.Store, root string) ([]string, error) {
	switch s := cloudtest.Plain(st).(type) {
	case *s3.Store:
		out, err := s.Client().ListMultipartUploads(ctx, &awss3.ListMultipartUploadsInput{
			Bucket: &root, Prefix: ptr(strings.TrimPrefix(strings.TrimPrefix(s.URI(""), "s3://"+root+"/"), "/")),
		})
		if err != nil {
			if strings.Contains(err.Error(), "NoSuchUpload") {
				return nil, nil // gofakes3, for a bucket without uploads
			}
			return nil, err
		}
		var names []string
		for _, u := range out.Uploads {
			names = append(names, *u.Key+" "+*u.UploadId)
		}
		return names, nil
	default:
		var names []string
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".spotagent-tmp-") {
				names = append(names, p)
			}
			return nil
		})
		return names, err
	}
}

func ptr[T any](v T) *T { return &v }

// killGroup SIGKILLs a process group (a trainer the killed agent left).
func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }

// faultStores is an S3 store (in-process) reached through a fault proxy,
// and the same store reached directly (to check what landed).
type faultStores struct {
	proxy  *faultproxy.Proxy
	direct cloud.Store
	uri    string
	env    []string // for a spotagent process: through the proxy
}

func newFaultStores(t *testing.T, prefix string) *faultStores {
	t.Helper()
	srv := startS3(t)
	s := &faultStores{proxy: faultproxy.New(t, srv.Endpoint), uri: "s3://" + srv.Bucket + "/" + prefix}
	s.direct = openTestStore(t, s.uri, all.Options{S3Endpoint: srv.Endpoint})
	s.env = append(srv.Env(), "AWS_ENDPOINT_URL_S3="+s.proxy.URL)
	return s
}

// dataReads records the checkpoint objects read from a faultStores store
// through its proxy: every GET under checkpoints/ but those whose path ends
// in skip (metadata), once start was called. It is a fault that never
// fires: its Match sees every request.
type dataReads struct {
	mu       sync.Mutex
	counting bool
	names    []string // each object's name (its key's last element), in order
}

func (s *faultStores) recordDataReads(skip string) *dataReads {
	d := &dataReads{}
	s.proxy.Set(faultproxy.Fault{Mode: faultproxy.Stall, Stall: time.Minute, Match: func(r *http.Request) bool {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/checkpoints/") && !strings.HasSuffix(r.URL.Path, skip) {
			d.mu.Lock()
			if d.counting {
				d.names = append(d.names, r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
			}
			d.mu.Unlock()
		}
		return false
	}})
	return d
}

// start records from now on, forgetting what came before.
func (d *dataReads) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counting, d.names = true, nil
}

// read is the names recorded since start, sorted.
func (d *dataReads) read() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(slices.Values(d.names))
}
