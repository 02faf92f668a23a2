package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

const (
	minioUser   = "spotbench"
	minioSecret = "spotbench-secret-key"
	bucket      = "bench"
)

// stores are the protocol servers every transfer figure uses.
type stores struct {
	minio *minioServer // stock settings
	// lean is MinIO started with --no-compat: no MD5 of every byte for the
	// ETag (half of MinIO's CPU in an upload). The 1 GiB upload is also
	// measured against it, to show the clients with less of the server's
	// work on the shared cores, as with a real bucket.
	lean *minioServer
	// disk is a stock MinIO with its data on disk (under the work
	// directory), started by the pipeline section for checkpoints that
	// tmpfs and memory cannot hold beside the trainer's state.
	disk    *minioServer
	gcsHost string // 127.0.0.1:PORT
	gcs     *exec.Cmd
	procs   []*exec.Cmd
}

// minioServer is one MinIO process holding the bench bucket.
type minioServer struct {
	url     string // http://127.0.0.1:PORT
	data    string // its data directory
	client  *s3.Client
	presign *s3.PresignClient
	pid     int
}

// cpu is the server's CPU time so far (user + system, seconds); 0 for nil
// (fake-gcs-server is not measured).
func (m *minioServer) cpu() float64 {
	if m == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid))
	if err != nil {
		return 0
	}
	// Fields after the ")" that ends the command name: utime and stime are
	// the 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// env is the environment for spotagent, the AWS CLI and the SDK.
func (m *minioServer) env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + minioUser, "AWS_SECRET_ACCESS_KEY=" + minioSecret, "AWS_REGION=us-east-1",
		"AWS_DEFAULT_REGION=us-east-1", "AWS_ENDPOINT_URL_S3=" + m.url,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
	}
}

func (s *stores) gcsEnv() []string { return []string{"STORAGE_EMULATOR_HOST=" + s.gcsHost} }

func (s *stores) Close() {
	for _, m := range []*minioServer{s.minio, s.lean, s.disk} {
		if m != nil {
			defer os.RemoveAll(m.data)
		}
	}
	for _, p := range s.procs {
		stop(p)
	}
}

// stopGCS ends fake-gcs-server once the sections that use it are done: it
// keeps garbage-collecting against its GOMEMLIMIT while idle (about 40 %
// of a core after the 1 GiB runs), which the later sections would share
// the machine with.
func (s *stores) stopGCS() {
	if s.gcs == nil {
		return
	}
	stop(s.gcs)
	s.procs = slices.DeleteFunc(s.procs, func(p *exec.Cmd) bool { return p == s.gcs })
	s.gcs, s.gcsHost = nil, ""
}

// stop ends p: SIGTERM, SIGKILL after 10 s.
func stop(p *exec.Cmd) {
	p.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.Process.Kill()
		<-done
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startStores starts two MinIO servers (single drive, data on tmpfs so that
// the server's disk is not what is measured: real S3 has no local disk in
// the way), one stock and one --no-compat, and fake-gcs-server (in memory,
// in a child process).
func startStores(c *config) (*stores, error) {
	s := &stores{}
	if _, err := os.Stat(c.minio); err != nil {
		return nil, fmt.Errorf("minio binary: %w (scripts/bench.sh installs it)", err)
	}
	var err error
	if s.minio, err = s.startMinIO(c, "minio"); err != nil {
		s.Close()
		return nil, err
	}
	if s.lean, err = s.startMinIO(c, "minio-lean", "--no-compat"); err != nil {
		s.Close()
		return nil, err
	}

	g := exec.Command(c.self, "gcs-server")
	// fake-gcs-server keeps objects in memory and recomputes checksums over
	// the whole object on every resumable chunk: a lot of garbage. Without a
	// limit its heap reached 8 GB and pushed the machine into reclaim.
	g.Env = append(os.Environ(), "GOMEMLIMIT=3GiB")
	out, err := g.StdoutPipe()
	if err != nil {
		return nil, err
	}
	g.Stderr = os.Stderr
	if err := g.Start(); err != nil {
		s.Close()
		return nil, err
	}
	s.procs = append(s.procs, g)
	s.gcs = g
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("gcs-server: %w", err)
	}
	s.gcsHost = strings.TrimSpace(line)
	logf("minio %s (data %s), minio --no-compat %s, fake-gcs-server %s", s.minio.url, s.minio.data, s.lean.url, s.gcsHost)
	return s, nil
}

// startMinIO starts a MinIO server named name (its data directory and log
// file) with the bench bucket.
func (s *stores) startMinIO(c *config, name string, flags ...string) (*minioServer, error) {
	return s.startMinIOIn(c, name, minioDataDir(c, name), flags...)
}

// startMinIOIn is startMinIO with its data in data.
func (s *stores) startMinIOIn(c *config, name, data string, flags ...string) (*minioServer, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	m := &minioServer{url: "http://" + addr, data: data}
	// Errors return m too: the caller's Close removes m.data.
	os.RemoveAll(m.data)
	if err := os.MkdirAll(m.data, 0o700); err != nil {
		return m, err
	}
	args := append([]string{"server", "--quiet", "--address", addr, "--console-address", "127.0.0.1:0"}, flags...)
	cmd := exec.Command(c.minio, append(args, m.data)...)
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+minioUser, "MINIO_ROOT_PASSWORD="+minioSecret,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off")
	mlog, _ := os.Create(filepath.Join(c.work, name+".log"))
	cmd.Stdout, cmd.Stderr = mlog, mlog
	if err := cmd.Start(); err != nil {
		return m, err
	}
	s.procs = append(s.procs, cmd)
	m.pid = cmd.Process.Pid
	if err := waitHTTP(m.url+"/minio/health/live", 60*time.Second); err != nil {
		return m, fmt.Errorf("%s: %w (log %s)", name, err, mlog.Name())
	}
	m.client = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(m.url), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(minioUser, minioSecret, ""),
	})
	m.presign = s3.NewPresignClient(m.client)
	if _, err := m.client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return m, fmt.Errorf("%s: create bucket: %w", name, err)
	}
	return m, nil
}

// minioDataDir is on tmpfs when there is room: the figures are about the
// client, not the local disk under a test server.
func minioDataDir(c *config, name string) string {
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && int64(st.Bavail)*int64(st.Bsize) > 12<<30 {
		return "/dev/shm/spotbench-" + name
	}
	return filepath.Join(c.work, name)
}

func waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("status %s", resp.Status)
			}
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (m *minioServer) presignPut(key string) (string, error) {
	req, err := m.presign.PresignPutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

func (m *minioServer) presignGet(key string) (string, error) {
	req, err := m.presign.PresignGetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

// deletePrefix removes every object under uri (s3://bench/p or
// gs://bench/p), reaching the store through env.
func deletePrefix(env []string, uri string) error {
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	ctx := context.Background()
	st, err := all.Open(ctx, uri, all.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	var keys []string
	if err := st.List(ctx, "", func(o cloud.ObjectInfo) error { keys = append(keys, o.Key); return nil }); err != nil {
		return err
	}
	for _, k := range keys {
		if err := st.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

// deleteRaw removes the single-stream object key ("up/raw-...") from m, or
// from fake-gcs-server when m is nil.
func (s *stores) deleteRaw(m *minioServer, key string) error {
	if m != nil {
		_, err := m.client.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		return err
	}
	req, err := http.NewRequest(http.MethodDelete, fmt.Sprintf("http://%s/storage/v1/b/%s/o/%s", s.gcsHost, bucket, url.PathEscape(key)), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("delete %s: %s", key, resp.Status)
	}
	return nil
}

// emptyTrash frees what MinIO keeps of deleted objects (it moves them to
// .minio.sys/tmp/.trash and purges later): on tmpfs that is memory.
func (s *stores) emptyTrash() {
	for _, m := range []*minioServer{s.minio, s.lean, s.disk} {
		if m == nil {
			continue
		}
		trash := filepath.Join(m.data, ".minio.sys", "tmp", ".trash")
		ents, _ := os.ReadDir(trash)
		for _, e := range ents {
			os.RemoveAll(filepath.Join(trash, e.Name()))
		}
	}
}

// cmdGCSServer serves fake-gcs-server (in memory) with the bench bucket,
// prints its host:port on stdout, and runs until SIGTERM/SIGINT.
func cmdGCSServer(args []string) int {
	srv, err := gcstest.Start(bucket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcs-server:", err)
		return 1
	}
	defer srv.Close()
	fmt.Println(srv.Host)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return 0
}

// cmdCommit commits one directory to a store through pkg/checkpoint's
// Committer with the agent's defaults: the code path `spotagent run` takes
// for every checkpoint (scan, concurrent streamed upload with CRC32C,
// manifest, latest.json). It prints the result as one JSON line.
// SPOTBENCH_CPUPROFILE=FILE writes a CPU profile of the commit (pprof).
func cmdCommit(args []string) int {
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
	c := &commit.Committer{Store: st, RunID: "bench"}
	start := time.Now()
	res, err := c.Commit(ctx, commit.Request{Dir: *dir, ID: "bench", Step: 1, Reason: "periodic"})
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
