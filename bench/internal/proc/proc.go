// Package proc is what spotbench measures processes with: running a
// command for its wall time, peak RSS and CPU; /proc figures of a running
// one; and the binaries and interpreters it runs.
package proc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// VMKiB reads a Vm* field (kB) of /proc/PID/status.
func VMKiB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// CPUTicks is utime+stime of /proc/PID/stat, in clock ticks.
func CPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	// after "pid (comm) ": state is f[0]; utime is field 14 → f[11], stime f[12].
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, nil
}

const ClkTck = 100 // sysconf(_SC_CLK_TCK) on Linux

// StageBinary copies the binary at src to dir/spotagent (fsynced) and
// returns the copy's path.
func StageBinary(dir, src string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "spotagent")
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	return dst, f.Close()
}

// DropCached drops the file's clean pages from the page cache
// (posix_fadvise POSIX_FADV_DONTNEED), so that the next exec reads it from
// disk.
func DropCached(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	const fadvDontneed = 4
	if _, _, e := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontneed, 0, 0); e != 0 {
		return fmt.Errorf("fadvise %s: %w", path, e)
	}
	return nil
}

// Run runs a command, returns its wall time, peak RSS (KiB) and CPU time
// (user + system, seconds).
func Run(env []string, stdout io.Writer, name string, args ...string) (time.Duration, int64, float64, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &errb
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return d, 0, 0, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss
	}
	return d, rss, (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(), nil
}

// MemAvailable is /proc/meminfo's MemAvailable in bytes, 0 if unknown.
func MemAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TorchPython is the interpreter that has PyTorch (Debian's python3-torch).
func TorchPython() string {
	if py := os.Getenv("SPOTBENCH_TORCH_PYTHON"); py != "" {
		return py
	}
	return "/usr/bin/python3"
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
