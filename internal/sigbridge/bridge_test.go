package sigbridge

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

func TestBridgeMarker(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          int64
		state         markerState
	}{
		{"number", "42\n", 42, markerStep},
		{"json", `{"step": 7}`, 7, markerStep},
		{"empty", "", 11, markerUnreadable}, // read twice, then numbered after the last step (10)
		{"garbage", "step forty", 11, markerUnreadable},
		{"negative", "-3", 11, markerUnreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			area := t.TempDir()
			dir := filepath.Join(area, "x")
			os.Mkdir(dir, 0o700)
			root, err := os.OpenRoot(area)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			r := &bridgeRequest{id: "x", name: "x"}
			if _, st := r.check(root, 10); st != markerMissing {
				t.Fatalf("no marker: state %v", st)
			}
			os.WriteFile(filepath.Join(dir, DoneMarker), []byte(tc.content), 0o600)
			step, st := r.check(root, 10)
			if st == markerMissing && tc.content == "" {
				step, st = r.check(root, 10)
			}
			if step != tc.want || st != tc.state {
				t.Fatalf("check = %d, %v; want %d, %v", step, st, tc.want, tc.state)
			}
			if _, err := os.Stat(filepath.Join(dir, DoneMarker)); !os.IsNotExist(err) {
				t.Fatalf("marker left in the checkpoint: %v", err)
			}
		})
	}
}

func TestSignalCaught(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	caught, known := signalCaught(cmd.Process.Pid, syscall.SIGUSR1)
	if !known || caught {
		t.Fatalf("sleep: caught=%v known=%v, want not caught, known", caught, known)
	}
	// This test binary's runtime has a handler for every signal.
	if caught, known := signalCaught(os.Getpid(), syscall.SIGUSR1); !known || !caught {
		t.Fatalf("self: caught=%v known=%v", caught, known)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"SIGUSR1": syscall.SIGUSR1, "usr2": syscall.SIGUSR2} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"SIGTERM", "KILL", "HUP", "", "9"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}
