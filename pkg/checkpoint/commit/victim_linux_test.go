package commit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// victimEnv makes the test binary a crash victim instead of a test run:
// it commits checkpoints in a loop until it is killed (see runVictim).
const victimEnv = "SPOTAGENT_CRASH_VICTIM"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(victimEnv); cfg != "" {
		os.Exit(runVictim(cfg))
	}
	os.Exit(m.Run())
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
	c := &Committer{Store: st, RunID: "crash"}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	for step := cfg.Start; ; step++ {
		id := fmt.Sprintf("t%d-s%d", cfg.Trial, step)
		dir := filepath.Join(cfg.Scratch, id)
		if err := writeFaultCheckpoint(dir, id, step); err != nil {
			fmt.Fprintln(os.Stderr, "victim:", err)
			return 2
		}
		if _, err := c.Commit(ctx, Request{Dir: dir, ID: id, Step: step, Reason: "periodic"}); err != nil {
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
	// Killed with this process too (a test binary's timeout panics past
	// every cleanup): an orphan would retry its commit against a server
	// that is gone.
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
	// A trial that fails before its kill leaves no victim behind.
	t.Cleanup(func() {
		v.cmd.Process.Kill()
		<-v.done
	})
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
// the file store, incomplete multipart uploads under an S3 store's prefix
// (bucket root).
func leftovers(ctx context.Context, st cloud.Store, root string) (int, error) {
	switch s := cloudtest.Plain(st).(type) {
	case *s3.Store:
		prefix := strings.TrimPrefix(strings.TrimPrefix(s.URI(""), "s3://"+root+"/"), "/")
		out, err := s.Client().ListMultipartUploads(ctx, &awss3.ListMultipartUploadsInput{Bucket: &root, Prefix: &prefix})
		if err != nil {
			if strings.Contains(err.Error(), "NoSuchUpload") {
				return 0, nil // gofakes3, for a bucket without uploads
			}
			return 0, err
		}
		return len(out.Uploads), nil
	default:
		n := 0
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".spotagent-tmp-") {
				n++
			}
			return nil
		})
		return n, err
	}
}
