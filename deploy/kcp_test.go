package deploy

// A real Kubernetes control plane for the manifest tests: etcd,
// kube-apiserver and kube-controller-manager built by scripts/kcp-build.sh
// (once, into a cache directory) and started on free loopback ports with
// self-signed certificates. The tests play the scheduler (the binding
// subresource, fake Nodes) and the kubelet (PATCH of pod status).

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// kcpControllers are the kube-controller-manager controllers the manifests
// need: the Job and DaemonSet controllers, the ServiceAccount controller
// (a namespace's "default" account), the garbage collector (a deleted Job's
// pods) and pod GC (the pods of a deleted Node).
var kcpControllers = []string{
	"job-controller", "daemonset-controller", "serviceaccount-controller",
	"garbage-collector-controller", "pod-garbage-collector-controller",
}

// controlPlane is a running etcd + kube-apiserver + kube-controller-manager.
type controlPlane struct {
	dir   string // certificates, data, logs, kubeconfig
	bin   string // the built binaries
	url   string // https://127.0.0.1:<port> of the apiserver
	http  *http.Client
	mu    sync.Mutex // procs: tests in parallel start controllers on the one control plane
	procs []*kcpProc
}

// add records a started process.
func (cp *controlPlane) add(pr *kcpProc) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.procs = append(cp.procs, pr)
}

// proc is the newest process started under name (nil: none).
func (cp *controlPlane) proc(name string) *kcpProc {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i := len(cp.procs) - 1; i >= 0; i-- {
		if cp.procs[i].name == name {
			return cp.procs[i]
		}
	}
	return nil
}

// started is a copy of the processes, oldest first.
func (cp *controlPlane) started() []*kcpProc {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*kcpProc(nil), cp.procs...)
}

type kcpProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

var kcp struct {
	once sync.Once
	cp   *controlPlane
	err  error
}

// sharedControlPlane starts the control plane on first use; TestMain stops
// it. Tests isolate themselves in their own namespaces.
func sharedControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	kcp.once.Do(func() { kcp.cp, kcp.err = startControlPlane() })
	if kcp.err != nil {
		t.Fatalf("control plane: %v", kcp.err)
	}
	return kcp.cp
}

func TestMain(m *testing.M) {
	// The Kubernetes tests (the only parallel ones here) mostly wait on the
	// Job controller's backoffs: run them all at once rather than
	// GOMAXPROCS at a time, unless -test.parallel says otherwise.
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "32")
	}
	code := m.Run()
	if kcp.cp != nil {
		if code != 0 {
			kcp.cp.dumpLogs(os.Stderr)
		}
		kcp.cp.stop()
	}
	os.Exit(code)
}

// buildControlPlane runs scripts/kcp-build.sh and returns the bin directory.
func buildControlPlane() (string, error) {
	cmd := exec.Command("../scripts/kcp-build.sh")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kcp-build.sh: %w\n%s", err, tail(stderr.String(), 4000))
	}
	if d := time.Since(start); d > 10*time.Second {
		fmt.Fprintf(os.Stderr, "kcp: control plane built in %s\n", d.Round(time.Second))
	}
	return strings.TrimSpace(string(out)), nil
}

func startControlPlane() (cp *controlPlane, err error) {
	bin, err := buildControlPlane()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "spotagent-kcp-")
	if err != nil {
		return nil, err
	}
	cp = &controlPlane{dir: dir, bin: bin}
	defer func() {
		if err != nil {
			cp.dumpLogs(os.Stderr)
			cp.stop()
		}
	}()
	if err := cp.writeCerts(); err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort, kcmPort := ports[0], ports[1], ports[2], ports[3]
	cp.url = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := cp.writeKubeconfig(); err != nil {
		return nil, err
	}
	if cp.http, err = cp.client(); err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := cp.start("etcd",
		"--name=kcp", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kcp="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return nil, err
	}
	if err := cp.waitHTTP("etcd", http.DefaultClient, etcdURL+"/health", 60*time.Second); err != nil {
		return nil, err
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := cp.start("kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+p("apiserver-certs"),
		"--tls-cert-file="+p("serving.crt"), "--tls-private-key-file="+p("serving.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p("sa.pub"),
		"--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=AlwaysAllow",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	); err != nil {
		return nil, err
	}
	if err := cp.waitHTTP("kube-apiserver", cp.http, cp.url+"/readyz", 120*time.Second); err != nil {
		return nil, err
	}
	if err := cp.start("kube-controller-manager",
		"--kubeconfig="+p("kubeconfig"),
		"--authentication-kubeconfig="+p("kubeconfig"),
		"--authorization-kubeconfig="+p("kubeconfig"),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", kcmPort),
		"--cert-dir="+p("kcm-certs"),
		"--controllers="+strings.Join(kcpControllers, ","),
		"--leader-elect=false",
		"--profiling=false",
		"--v=2",
	); err != nil {
		return nil, err
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // its own self-signed serving cert
	if err := cp.waitHTTP("kube-controller-manager", insecure, fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort), 60*time.Second); err != nil {
		return nil, err
	}
	if os.Getenv("KCP_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "kcp: up, kubectl --kubeconfig %s\n", filepath.Join(dir, "kubeconfig"))
	}
	return cp, nil
}

// freePorts returns n distinct ports that were free a moment ago, below
// the ephemeral range (testutil.FreePorts: a connection flood elsewhere
// on the machine cannot take them first).
func freePorts(n int) ([]int, error) { return testutil.FreePorts(n) }

func (cp *controlPlane) start(name string, args ...string) error {
	return cp.startPath(name, filepath.Join(cp.bin, name), args...)
}

// startPath starts a program, its output in <dir>/<name>.log.
func (cp *controlPlane) startPath(name, path string, args ...string) error {
	logPath := filepath.Join(cp.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = cp.dir
	// Dies with the test binary even if TestMain never gets to stop it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	pr := &kcpProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		pr.err = cmd.Wait()
		f.Close()
		close(pr.done)
	}()
	cp.add(pr)
	return nil
}

// waitHTTP polls url until it answers 200, the process exits or timeout.
func (cp *controlPlane) waitHTTP(name string, c *http.Client, url string, timeout time.Duration) error {
	pr := cp.proc(name)
	if pr == nil {
		return fmt.Errorf("%s: never started", name)
	}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-pr.done:
			return fmt.Errorf("%s exited: %v", name, pr.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, tail(string(b), 500))
		} else {
			last = err.Error()
		}
		cancel()
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready at %s within %s: %s", name, url, timeout, last)
}

// stop terminates the processes in reverse order and removes the directory.
func (cp *controlPlane) stop() {
	procs := cp.started()
	for i := len(procs) - 1; i >= 0; i-- {
		pr := procs[i]
		_ = pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGKILL)
			<-pr.done
		}
	}
	if os.Getenv("KCP_KEEP") == "" {
		os.RemoveAll(cp.dir)
	}
}

// dumpLogs writes the tail of every process log: the record of a failure.
func (cp *controlPlane) dumpLogs(w io.Writer) {
	for _, pr := range cp.started() {
		b, _ := os.ReadFile(pr.log)
		fmt.Fprintf(w, "=== %s (%s), last lines:\n%s\n", pr.name, pr.log, tail(string(b), 6000))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// writeCerts makes a CA, the apiserver's serving certificate for
// 127.0.0.1, an admin client certificate (group system:masters) and the
// service-account signing key.
func (cp *controlPlane) writeCerts() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "spotagent-kcp-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := cp.writePEM("ca.crt", "CERTIFICATE", caDER); err != nil {
		return err
	}
	leaf := func(name string, serial int64, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := cp.writePEM(name+".crt", "CERTIFICATE", der); err != nil {
			return err
		}
		return cp.writePEM(name+".key", "EC PRIVATE KEY", keyDER)
	}
	if err := leaf("serving", 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}); err != nil {
		return err
	}
	if err := leaf("admin", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kcp-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := cp.writePEM("sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return err
	}
	return cp.writePEM("sa.pub", "PUBLIC KEY", pub)
}

func (cp *controlPlane) writePEM(name, typ string, der []byte) error {
	return os.WriteFile(filepath.Join(cp.dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// writeKubeconfig writes the admin kubeconfig: for kube-controller-manager
// and for kubectl by hand (KCP_KEEP=1 keeps the directory).
func (cp *controlPlane) writeKubeconfig() error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kcp
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: kcp
  context: {cluster: kcp, user: admin}
current-context: kcp
`, cp.url, filepath.Join(cp.dir, "ca.crt"), filepath.Join(cp.dir, "admin.crt"), filepath.Join(cp.dir, "admin.key"))
	return os.WriteFile(filepath.Join(cp.dir, "kubeconfig"), []byte(cfg), 0o600)
}

func (cp *controlPlane) client() (*http.Client, error) {
	caPEM, err := os.ReadFile(filepath.Join(cp.dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(filepath.Join(cp.dir, "admin.crt"), filepath.Join(cp.dir, "admin.key"))
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
			MaxIdleConnsPerHost: 16,
		},
	}, nil
}

// apiError is a non-2xx answer of the apiserver.
type apiError struct {
	Code    int
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("apiserver: %d %s", e.Code, e.Message) }

func isNotFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == http.StatusNotFound
}

// do sends one request; body is JSON-encoded unless it is []byte; out, when
// not nil, receives the decoded answer.
func (cp *controlPlane) do(method, path, contentType string, body, out any) error {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, cp.url+path, rd)
	if err != nil {
		return err
	}
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := cp.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var st struct{ Message string }
		_ = json.Unmarshal(data, &st)
		if st.Message == "" {
			st.Message = string(data)
		}
		if len(st.Message) > 1500 {
			st.Message = st.Message[:1500] + "…"
		}
		return &apiError{Code: resp.StatusCode, Message: st.Message}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// query builds "?k=v&…" from pairs.
func query(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return "?" + v.Encode()
}
