// Package benchstore runs the protocol servers spotbench measures against:
// MinIO (stock, --no-compat, on disk) and fake-gcs-server, each in its own
// process so that their CPU is not the client's.
package benchstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

const (
	minioUser   = "spotbench"
	minioSecret = "spotbench-secret-key"
	// Bucket is the bucket every server holds.
	Bucket = "bench"
)

// Stores are the protocol servers every transfer figure uses.
type Stores struct {
	MinIO *MinIO // stock settings
	// lean is MinIO started with --no-compat: no MD5 of every byte for the
	// ETag (half of MinIO's CPU in an upload). The 1 GiB upload is also
	// measured against it, to show the clients with less of the server's
	// work on the shared cores, as with a real bucket.
	Lean *MinIO
	// disk is a stock MinIO with its data on disk (under the work
	// directory), started by the pipeline section for checkpoints that
	// tmpfs and memory cannot hold beside the trainer's state (OnDisk).
	disk    *MinIO
	GCSHost string // 127.0.0.1:PORT
	gcs     *exec.Cmd
	procs   []*exec.Cmd
	data    []string // every MinIO's data directory, removed by Close
	bin     string   // the MinIO binary
	work    string   // where logs (and data off tmpfs) go
}

// MinIO is one MinIO process holding the bench bucket.
type MinIO struct {
	URL     string // http://127.0.0.1:PORT
	Data    string // its data directory
	Client  *s3.Client
	presign *s3.PresignClient
	pid     int
}

// CPU is the server's CPU time so far (user + system, seconds); 0 for nil
// (fake-gcs-server is not measured).
func (m *MinIO) CPU() float64 {
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

// Env is the environment for spotagent, the AWS CLI and the SDK.
func (m *MinIO) Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + minioUser, "AWS_SECRET_ACCESS_KEY=" + minioSecret, "AWS_REGION=us-east-1",
		"AWS_DEFAULT_REGION=us-east-1", "AWS_ENDPOINT_URL_S3=" + m.URL,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
	}
}

// GCSEnv is the environment that points clients at fake-gcs-server.
func (s *Stores) GCSEnv() []string { return []string{"STORAGE_EMULATOR_HOST=" + s.GCSHost} }

// Close stops every server and removes their data.
func (s *Stores) Close() {
	for _, d := range s.data {
		defer os.RemoveAll(d)
	}
	for _, p := range s.procs {
		Stop(p)
	}
}

// StopGCS ends fake-gcs-server once the sections that use it are done: it
// keeps garbage-collecting against its GOMEMLIMIT while idle (about 40 %
// of a core after the 1 GiB runs), which the later sections would share
// the machine with.
func (s *Stores) StopGCS() {
	if s.gcs == nil {
		return
	}
	Stop(s.gcs)
	s.procs = slices.DeleteFunc(s.procs, func(p *exec.Cmd) bool { return p == s.gcs })
	s.gcs, s.GCSHost = nil, ""
}

// Stop ends p: SIGTERM, SIGKILL after 10 s.
func Stop(p *exec.Cmd) {
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

// FreePort is a loopback address no one listens on (yet).
func FreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Start starts two MinIO servers (single drive, data on tmpfs so that
// the server's disk is not what is measured: real S3 has no local disk in
// the way), one stock and one --no-compat, and fake-gcs-server (in memory,
// in a child process: self is spotbench, run as `self gcs-server`). bin is
// the MinIO binary; work holds the servers' logs.
func Start(bin, work, self string) (*Stores, error) {
	s := New(bin, work)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("minio binary: %w (scripts/bench.sh installs it)", err)
	}
	var err error
	if s.MinIO, err = s.StartMinIO("minio"); err != nil {
		s.Close()
		return nil, err
	}
	if s.Lean, err = s.StartMinIO("minio-lean", "--no-compat"); err != nil {
		s.Close()
		return nil, err
	}

	g := exec.Command(self, "gcs-server")
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
	s.GCSHost = strings.TrimSpace(line)
	return s, nil
}

// New is an empty set of servers: MinIO binary bin, logs under work.
func New(bin, work string) *Stores { return &Stores{bin: bin, work: work} }

// StartMinIO starts a MinIO server named name (its data directory and log
// file) with the bench bucket.
func (s *Stores) StartMinIO(name string, flags ...string) (*MinIO, error) {
	return s.StartMinIOIn(name, DataDir(s.work, name), flags...)
}

// OnDisk is a stock MinIO with its data on disk, under the work
// directory, started on the first call: for checkpoints that tmpfs and
// memory cannot hold beside the trainer's state.
func (s *Stores) OnDisk() (*MinIO, error) {
	if s.disk == nil {
		m, err := s.StartMinIOIn("minio-disk", filepath.Join(s.work, "minio-disk"))
		if err != nil {
			return nil, err
		}
		s.disk = m
	}
	return s.disk, nil
}

// StartMinIOIn is StartMinIO with its data in data.
func (s *Stores) StartMinIOIn(name, data string, flags ...string) (*MinIO, error) {
	addr, err := FreePort()
	if err != nil {
		return nil, err
	}
	m := &MinIO{URL: "http://" + addr, Data: data}
	s.data = append(s.data, data) // Close removes it, whatever happens here
	os.RemoveAll(m.Data)
	if err := os.MkdirAll(m.Data, 0o700); err != nil {
		return m, err
	}
	args := append([]string{"server", "--quiet", "--address", addr, "--console-address", "127.0.0.1:0"}, flags...)
	cmd := exec.Command(s.bin, append(args, m.Data)...)
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+minioUser, "MINIO_ROOT_PASSWORD="+minioSecret,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off")
	mlog, _ := os.Create(filepath.Join(s.work, name+".log"))
	cmd.Stdout, cmd.Stderr = mlog, mlog
	if err := cmd.Start(); err != nil {
		return m, err
	}
	s.procs = append(s.procs, cmd)
	m.pid = cmd.Process.Pid
	if err := WaitHTTP(m.URL+"/minio/health/live", 60*time.Second); err != nil {
		return m, fmt.Errorf("%s: %w (log %s)", name, err, mlog.Name())
	}
	m.Client = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(m.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(minioUser, minioSecret, ""),
	})
	m.presign = s3.NewPresignClient(m.Client)
	if _, err := m.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(Bucket)}); err != nil {
		return m, fmt.Errorf("%s: create bucket: %w", name, err)
	}
	return m, nil
}

// DataDir is on tmpfs when there is room: the figures are about the
// client, not the local disk under a test server.
func DataDir(work, name string) string {
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && int64(st.Bavail)*int64(st.Bsize) > 12<<30 {
		return "/dev/shm/spotbench-" + name
	}
	return filepath.Join(work, name)
}

// WaitHTTP polls url until it answers 200, for at most timeout.
func WaitHTTP(url string, timeout time.Duration) error {
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

// PresignPut is a presigned PUT URL of key.
func (m *MinIO) PresignPut(key string) (string, error) {
	req, err := m.presign.PresignPutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(Bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

// PresignGet is a presigned GET URL of key.
func (m *MinIO) PresignGet(key string) (string, error) {
	req, err := m.presign.PresignGetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(Bucket), Key: aws.String(key)},
		s3.WithPresignExpires(time.Hour))
	if err != nil {
		return "", err
	}
	return req.URL, nil
}

// DeletePrefix removes every object under uri (s3://bench/p or
// gs://bench/p), reaching the store through env.
func DeletePrefix(env []string, uri string) error {
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

// DeleteRaw removes the single-stream object key ("up/raw-...") from m, or
// from fake-gcs-server when m is nil.
func (s *Stores) DeleteRaw(m *MinIO, key string) error {
	if m != nil {
		_, err := m.Client.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(Bucket), Key: aws.String(key)})
		return err
	}
	req, err := http.NewRequest(http.MethodDelete, fmt.Sprintf("http://%s/storage/v1/b/%s/o/%s", s.GCSHost, Bucket, url.PathEscape(key)), nil)
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

// EmptyTrash frees what MinIO keeps of deleted objects (it moves them to
// .minio.sys/tmp/.trash and purges later): on tmpfs that is memory.
func (s *Stores) EmptyTrash() {
	for _, m := range []*MinIO{s.MinIO, s.Lean, s.disk} {
		if m == nil {
			continue
		}
		trash := filepath.Join(m.Data, ".minio.sys", "tmp", ".trash")
		ents, _ := os.ReadDir(trash)
		for _, e := range ents {
			os.RemoveAll(filepath.Join(trash, e.Name()))
		}
	}
}

// ServeGCS serves fake-gcs-server (in memory) with the bench bucket,
// prints its host:port on stdout, and runs until SIGTERM/SIGINT.
func ServeGCS(args []string) int {
	srv, err := gcstest.Start(Bucket)
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
