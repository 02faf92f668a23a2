package protocol

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dialHelperEnv makes the test binary act as a trainer that connects to the
// socket named by its value and reports whether the agent closed it.
const dialHelperEnv = "SPOTAGENT_TEST_DIAL"

func TestMain(m *testing.M) {
	if path := os.Getenv(dialHelperEnv); path != "" {
		os.Exit(dialHelper(path))
	}
	os.Exit(m.Run())
}

// dialHelper prints "closed" if the agent closes the connection without a
// word, "open" if it is still open after 3s.
func dialHelper(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	defer c.Close()
	fmt.Fprintf(c, "{\"type\":\"hello\",\"pid\":%d}\n", os.Getpid())
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = c.Read(make([]byte, 1))
	switch {
	case err == io.EOF || (err != nil && strings.Contains(err.Error(), "connection reset")):
		fmt.Println("closed")
	case err == nil:
		fmt.Println("got data")
	default:
		fmt.Println("open:", err)
	}
	return 0
}

func TestUIDAllowed(t *testing.T) {
	for _, tc := range []struct {
		uid, self int
		allow     []int
		want      bool
	}{
		{uid: 1000, self: 1000, want: true},
		{uid: 0, self: 1000, want: true},
		{uid: 1001, self: 1000, want: false},
		{uid: 65534, self: 0, want: false},
		{uid: 1001, self: 1000, allow: []int{1002, 1001}, want: true},
		{uid: 1003, self: 1000, allow: []int{1002, 1001}, want: false},
	} {
		if got := uidAllowed(tc.uid, tc.self, tc.allow); got != tc.want {
			t.Errorf("uidAllowed(%d, self %d, allow %v)=%v, want %v", tc.uid, tc.self, tc.allow, got, tc.want)
		}
	}
}

// TestServer_RefusesOtherUID connects as nobody (65534) from a real process.
func TestServer_RefusesOtherUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a helper as uid 65534")
	}
	const nobody = 65534
	// The helper must reach the socket and its own binary: a 0755 dir, and a
	// 0666 socket so that only the uid check can refuse it.
	dir, err := os.MkdirTemp("", "sa-uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper.test")
	copyExecutable(t, bin)

	// run may be called off the test goroutine: it reports, never fails.
	run := func(s *testServer) string {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), dialHelperEnv+"="+s.Path())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Sprintf("helper: %v: %s", err, out.String())
		}
		return strings.TrimSpace(out.String())
	}

	t.Run("Refused", func(t *testing.T) {
		s := startServer(t, ServerConfig{Path: filepath.Join(dir, "a.sock"), Mode: 0o666})
		if got := run(s); got != "closed" {
			t.Errorf("helper as nobody: %q, want closed", got)
		}
		logs := s.logs.FilterMessage("connection refused: peer uid not allowed").All()
		if len(logs) != 1 || logs[0].ContextMap()["uid"] != int64(nobody) {
			t.Errorf("refusal logs = %+v, want one with uid %d", logs, nobody)
		}
		if n := len(s.Events()); n != 0 {
			t.Errorf("%d events from a refused peer, want 0", n)
		}
		s.hello(t, 0) // the agent's own user is still served
	})
	t.Run("DefaultModes", func(t *testing.T) {
		// The default socket: in a 0700 directory of the agent's own,
		// itself 0600. Another uid cannot even connect.
		s := startServer(t, ServerConfig{Path: filepath.Join(dir, "private", "c.sock"), PrivateDir: true})
		if got := run(s); !strings.Contains(got, "dial error:") || !strings.Contains(got, "permission denied") {
			t.Errorf("helper as nobody: %q, want its connect refused with permission denied", got)
		}
		if n := s.logs.FilterMessage("connection refused: peer uid not allowed").Len(); n != 0 {
			t.Errorf("%d refusals logged: the connection reached the agent", n)
		}
	})
	t.Run("AllowUIDs", func(t *testing.T) {
		// IdentifyPeers as a node agent: a process outside any pod is its uid.
		s := startServer(t, ServerConfig{Path: filepath.Join(dir, "b.sock"), Mode: 0o666, AllowUIDs: []int{nobody}, IdentifyPeers: true})
		out := make(chan string, 1)
		go func() { out <- run(s) }()
		ev := s.nextEvent(t)
		if ev.Msg.Type != TypeHello || ev.Conn.PeerUID() != nobody {
			t.Errorf("event %+v from uid %d, want hello from %d", ev.Msg, ev.Conn.PeerUID(), nobody)
		}
		if got, want := ev.Conn.PeerIdentity(), fmt.Sprintf("uid:%d", nobody); got != want {
			t.Errorf("PeerIdentity=%q, want %q", got, want)
		}
		ev.Conn.Send(Message{Type: TypeWelcome})
		if got := <-out; got != "got data" {
			t.Errorf("helper as allowed nobody: %q, want got data", got)
		}
	})
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	src, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestPodFromCgroup(t *testing.T) {
	const uid = "0f6a3c8e-1b2d-4e5f-9a8b-7c6d5e4f3a2b"
	for _, tc := range []struct{ name, cgroup, want string }{
		{"V1Cgroupfs", "12:memory:/kubepods/burstable/pod" + uid + "/4f1c9c\n11:cpu:/kubepods/burstable/pod" + uid + "/4f1c9c\n", uid},
		{"V2Systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-abc.scope\n", uid},
		{"V2BestEffortNamespaced", "0::/../../kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-abc.scope\n", uid},
		{"V2Guaranteed", "0::/kubepods/pod" + strings.ToUpper(uid) + "/abc\n", uid},
		{"NotKubernetes", "0::/user.slice/user-1000.slice/session-3.scope\n", ""},
		{"PodWordOnly", "0::/system.slice/pod" + uid + ".service\n", ""},
		{"Root", "0::/\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podFromCgroup(tc.cgroup); got != tc.want {
				t.Errorf("podFromCgroup=%q, want %q", got, tc.want)
			}
		})
	}
}

func TestPeerIdentity(t *testing.T) {
	// This process is not in a pod: its identity is its uid. A pid that
	// is not visible (another pid namespace: 0) falls back to the uid too.
	self, err := os.ReadFile("/proc/self/cgroup")
	if err == nil && podFromCgroup(string(self)) != "" {
		t.Skip("running inside a Kubernetes pod")
	}
	for _, cred := range []peerCredentials{{UID: 1234, PID: os.Getpid()}, {UID: 1234, PID: 0}} {
		if got, want := peerIdentity(cred), fmt.Sprintf("uid:%d", cred.UID); got != want {
			t.Errorf("peerIdentity(%+v)=%q, want %q", cred, got, want)
		}
	}
}
