package main

import (
	"bufio"
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
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/gcs/gcstest"
)

const (
	minioUser   = "spotbench"
	minioSecret = "spotbench-secret-key"
	bucket      = "bench"
)

// stores are the protocol servers every transfer figure uses.
type stores struct {
	minioURL string // http://127.0.0.1:PORT
	data     string // MinIO's data directory
	gcsHost  string // 127.0.0.1:PORT
	procs    []*exec.Cmd
	s3       *s3.Client
	presign  *s3.PresignClient
}

// s3Env is the environment for spotagent, the AWS CLI and the SDK.
func (s *stores) s3Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + minioUser, "AWS_SECRET_ACCESS_KEY=" + minioSecret, "AWS_REGION=us-east-1",
		"AWS_DEFAULT_REGION=us-east-1", "AWS_ENDPOINT_URL_S3=" + s.minioURL,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
	}
}

func (s *stores) gcsEnv() []string { return []string{"STORAGE_EMULATOR_HOST=" + s.gcsHost} }

func (s *stores) Close() {
	defer os.RemoveAll(s.data)
	for _, p := range s.procs {
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.Process.Kill()
		}
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

// startStores starts MinIO (single drive, data on tmpfs so that the server's
// disk is not what is measured: real S3 has no local disk in the way) and
// fake-gcs-server (in memory, in a child process).
func startStores(c *config) (*stores, error) {
	s := &stores{}
	if _, err := os.Stat(c.minio); err != nil {
		return nil, fmt.Errorf("minio binary: %w (scripts/bench.sh installs it)", err)
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	data := minioDataDir(c)
	s.data = data
	os.RemoveAll(data)
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	m := exec.Command(c.minio, "server", "--quiet", "--address", addr, "--console-address", "127.0.0.1:0", data)
	m.Env = append(os.Environ(), "MINIO_ROOT_USER="+minioUser, "MINIO_ROOT_PASSWORD="+minioSecret,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off")
	mlog, _ := os.Create(filepath.Join(c.work, "minio.log"))
	m.Stdout, m.Stderr = mlog, mlog
	if err := m.Start(); err != nil {
		return nil, err
	}
	s.procs = append(s.procs, m)
	s.minioURL = "http://" + addr
	if err := waitHTTP(s.minioURL+"/minio/health/live", 60*time.Second); err != nil {
		s.Close()
		return nil, fmt.Errorf("minio: %w (log %s)", err, mlog.Name())
	}
	s.s3 = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(s.minioURL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(minioUser, minioSecret, ""),
	})
	s.presign = s3.NewPresignClient(s.s3)
	if _, err := s.s3.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		s.Close()
		return nil, fmt.Errorf("minio: create bucket: %w", err)
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
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("gcs-server: %w", err)
	}
	s.gcsHost = strings.TrimSpace(line)
	logf("minio %s (data %s), fake-gcs-server %s", s.minioURL, data, s.gcsHost)
	return s, nil
}

// minioDataDir is on tmpfs when there is room: the figures are about the
// client, not the local disk under a test server.
func minioDataDir(c *config) string {
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && int64(st.Bavail)*int64(st.Bsize) > 12<<30 {
		return "/dev/shm/spotbench-minio"
	}
	return filepath.Join(c.work, "minio")
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

func (s *stores) presignPut(key string) (string, error) {
	req, err := s.presign.PresignPutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

func (s *stores) presignGet(key string) (string, error) {
	req, err := s.presign.PresignGetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

// deletePrefix removes every object under uri (s3://bench/p or gs://bench/p).
func (s *stores) deletePrefix(uri string) error {
	env := s.s3Env()
	if strings.HasPrefix(uri, "gs://") {
		env = s.gcsEnv()
	}
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

// deleteRaw removes the single-stream object key ("up/raw-...").
func (s *stores) deleteRaw(store, key string) error {
	if store == "s3" {
		_, err := s.s3.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
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
	trash := filepath.Join(s.data, ".minio.sys", "tmp", ".trash")
	ents, _ := os.ReadDir(trash)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(trash, e.Name()))
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
// for every checkpoint (scan, concurrent streamed upload with sha256,
// manifest, latest.json). It prints the result as one JSON line.
func cmdCommit(args []string) int {
	fs := flag.NewFlagSet("commit", flag.ExitOnError)
	uri := fs.String("store", "", "store URI")
	dir := fs.String("dir", "", "checkpoint directory")
	fs.Parse(args)
	ctx := context.Background()
	st, err := all.Open(ctx, *uri, all.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "commit:", err)
		return 1
	}
	defer st.Close()
	c := &checkpoint.Committer{Store: st, RunID: "bench"}
	start := time.Now()
	res, err := c.Commit(ctx, checkpoint.Request{Dir: *dir, ID: "bench", Step: 1, Reason: "periodic"})
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
