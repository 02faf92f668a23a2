package config

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

func TestCheck_PartModeSpeaksTheProtocol(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		word string // "" no error
	}{
		{"SingleNodeSignal", Config{Signal: syscall.SIGUSR1}, ""},
		{"NodeProtocol", Config{Node: "1"}, ""},
		{"NodeSignal", Config{Node: "1", Signal: syscall.SIGUSR1}, "--signal"},
		{"NodeWatch", Config{Node: "1", Watch: &source.WatchConfig{}}, "--watch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Check()
			if tc.word == "" && err != nil || tc.word != "" && (err == nil || !strings.Contains(err.Error(), tc.word)) {
				t.Fatalf("Check() = %v, want %q", err, tc.word)
			}
		})
	}
}

func TestSetDefaults_FillsOnlyWhatIsZero(t *testing.T) {
	var c Config
	c.SetDefaults()
	if c.Keep != 3 || c.TermGrace != 25*time.Second || c.KillAfter != 5*time.Second || c.SignalWindow != DefaultSignalWindow ||
		c.OnRebalance != "checkpoint" || c.RequestTimeout != 10*time.Minute || c.Log == nil || c.Metrics.NoticeMetrics == nil || c.Metrics.CheckpointMetrics == nil || c.Metrics.RunMetrics == nil || c.Scheduler == nil {
		t.Fatalf("defaults %+v", c)
	}
	c = Config{Keep: 7, TermGrace: time.Minute, SignalWindow: -1}
	c.SetDefaults()
	if c.Keep != 7 || c.TermGrace != time.Minute || c.SignalWindow != -1 {
		t.Fatalf("set values overwritten: keep %d grace %v window %v", c.Keep, c.TermGrace, c.SignalWindow)
	}
	// The margin: 0 is the default 5 s, a negative one none (--margin 0s:
	// it was the default too, while status and report said 0).
	for in, want := range map[time.Duration]time.Duration{0: 5 * time.Second, -1: 0, 2 * time.Second: 2 * time.Second} {
		c = Config{Margin: in}
		c.SetDefaults()
		if c.Margin != want {
			t.Errorf("margin %v: %v after the defaults, want %v", in, c.Margin, want)
		}
	}
}

func TestOverlapsRestore_OnlyForASocketTrainer(t *testing.T) {
	if !(&Config{OverlapRestore: true}).OverlapsRestore() {
		t.Fatal("asked, with a socket trainer: no overlap")
	}
	if (&Config{OverlapRestore: true, Signal: syscall.SIGUSR1}).OverlapsRestore() || (&Config{OverlapRestore: true, Watch: &source.WatchConfig{}}).OverlapsRestore() {
		t.Fatal("a trainer that reads the environment or DIR cannot wait for a pending restore")
	}
}

func env(list []string, key string) (string, bool) {
	for _, kv := range list {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

func TestChildEnv(t *testing.T) {
	t.Setenv("SPOTAGENT_SOCKET", "/elsewhere")
	t.Setenv(localdirs.ExitFileEnv, "") // restored after the test
	os.Unsetenv(localdirs.ExitFileEnv)
	c := Config{RunID: "r", CheckpointDir: "/ckpt", Server: protocol.ServerConfig{Path: "/run/s.sock"}}
	e := c.ChildEnv("/ckpt/area", false, &protocol.Resume{Dir: "/ckpt/area/restore/c1", Step: 42, Manifest: "/m.json"})
	for k, want := range map[string]string{"SPOTAGENT_RUN_ID": "r", "SPOTAGENT_CHECKPOINT_DIR": "/ckpt", "SPOTAGENT_SOCKET": "/run/s.sock",
		"SPOTAGENT_RESUME_DIR": "/ckpt/area/restore/c1", "SPOTAGENT_RESUME_STEP": "42", "SPOTAGENT_RESUME_MANIFEST": "/m.json",
		localdirs.ExitFileEnv: "/ckpt/area/" + localdirs.ExitFileName} {
		if got, _ := env(e, k); got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	n := 0
	for _, kv := range e {
		if strings.HasPrefix(kv, "SPOTAGENT_SOCKET=") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d SPOTAGENT_SOCKET entries, want the agent's alone", n)
	}
	if _, ok := env(e, ResumeEnv); ok {
		t.Fatal("SPOTAGENT_RESUME set without a pending restore")
	}

	// Signal mode: no socket; an overlapped restore says pending.
	c.Signal = syscall.SIGUSR1
	e = c.ChildEnv("/ckpt/area", true, nil)
	if _, ok := env(e, "SPOTAGENT_SOCKET"); ok {
		t.Fatal("signal mode: the trainer is given the socket")
	}
	if v, _ := env(e, "SPOTAGENT_REQUEST_FILE"); !strings.HasPrefix(v, "/ckpt/area/") {
		t.Fatalf("request file %q, want it in the area", v)
	}
	if v, _ := env(e, ResumeEnv); v != protocol.RestorePending {
		t.Fatalf("%s=%q, want pending", ResumeEnv, v)
	}
	if slices.ContainsFunc(e, func(kv string) bool { return strings.HasPrefix(kv, "SPOTAGENT_RESUME_DIR=") }) {
		t.Fatal("a resume dir without a resume")
	}
}

func TestWelcome_SpeaksTheVersionBothKnow(t *testing.T) {
	c := Config{RunID: "r", CheckpointDir: "/ckpt"}
	for have, want := range map[int]int{0: 1, 1: 1, 2: 2, 99: protocol.ProtocolVersion} {
		w := c.Welcome(protocol.Message{Type: protocol.TypeHello, Version: have}, nil)
		if w.Version != want || w.Type != protocol.TypeWelcome || w.RunID != "r" {
			t.Errorf("hello version %d: welcome %+v, want version %d", have, w, want)
		}
	}
}

func TestRequestDeadline_LeavesRoomToUpload(t *testing.T) {
	c := Config{}
	c.SetDefaults()
	now := time.Now()
	deadline := now.Add(2 * time.Minute)
	got := c.RequestDeadline(0, deadline, now) // nothing to upload: the margin alone
	if want := deadline.Add(-c.Margin); !got.Equal(want) {
		t.Fatalf("request deadline %v before the deadline, want the margin %v", deadline.Sub(got), c.Margin)
	}
	short := now.Add(2 * c.Margin / 3)
	if got := c.RequestDeadline(0, short, now); !got.Equal(now.Add(short.Sub(now) / 2)) {
		t.Fatalf("short notice: request deadline %v from now, want half of %v", got.Sub(now), short.Sub(now))
	}
}
