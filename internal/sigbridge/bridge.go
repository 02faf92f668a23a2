// Package sigbridge is the signal fallback for trainers that do not speak
// the protocol: a trainer of its own that speaks the protocol to the agent
// for them, and turns each checkpoint request into a file and a signal.
package sigbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// The signal fallback for trainers that do not speak the protocol (a
// framework's own SIGUSR1 handler, a script): the agent writes the request
// to RequestFile in the agent's area of the checkpoint directory and
// signals the trainer; the
// trainer saves into the request's dir and then creates DoneMarker in it,
// holding the step number (or nothing).
const (
	RequestFile = "request.json"
	DoneMarker  = "SPOTAGENT_DONE"
)

// signalRequest is what RequestFile holds.
type signalRequest struct {
	ID       string    `json:"id"`
	Dir      string    `json:"dir"`
	Reason   string    `json:"reason"`
	Deadline time.Time `json:"deadline"`
}

// Bridge speaks the protocol on behalf of the child: it connects to
// the agent's socket like any trainer, so the agent's request, deadline,
// commit and stop logic is the same for both kinds of trainer.
type Bridge struct {
	Socket string
	Sig    syscall.Signal
	// Area is the agent's area of the checkpoint directory (AreaPath):
	// RequestFile and the request directories live there. The bridge
	// reads and writes only through it.
	Area     *os.Root
	AreaPath string
	PID      func() int // the child's pid now (0: not running)
	Poll     time.Duration
	Log      *zap.Logger
}

// Serve runs the bridge until ctx ends, connecting again (after a second)
// if the agent drops the connection: without the bridge the trainer would
// get no checkpoint requests at all.
func (b *Bridge) Serve(ctx context.Context) {
	// A handle of its own: the agent closes its handles when it finishes.
	area, err := b.Area.OpenRoot(".")
	if err != nil {
		b.Log.Error("signal fallback: checkpoint directory unusable", zap.Error(err))
		return
	}
	defer area.Close()
	b.Area = area
	for {
		err := b.run(ctx)
		if ctx.Err() != nil {
			return
		}
		b.Log.Error("signal fallback: connection to the agent lost, reconnecting", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// run serves one connection until ctx ends or the agent closes it. Its
// reader ends before it returns.
// receive reads the agent's messages into msgs until the connection or
// ctx ends; read closes once the reader has returned.
func receive(ctx context.Context, c *protocol.Client) (msgs <-chan protocol.Message, read <-chan struct{}) {
	ms := make(chan protocol.Message, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ms)
		for {
			m, err := c.Recv(ctx)
			if errors.Is(err, protocol.ErrBadMessage) {
				continue
			}
			if err != nil {
				return
			}
			select {
			case ms <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ms, done
}

func (b *Bridge) run(ctx context.Context) error {
	c, err := protocol.Dial(ctx, b.Socket)
	if err != nil {
		return fmt.Errorf("signal bridge: %w", err)
	}
	b.Area.Remove(RequestFile) // what an earlier agent left

	msgs, read := receive(ctx, c)
	defer func() { c.Close(); <-read }()
	send := func(m protocol.Message) error { return c.Send(ctx, m) }
	zero, one := 0, 1
	if err := send(protocol.Message{Type: protocol.TypeHello, PID: os.Getpid(), Rank: &zero, WorldSize: &one}); err != nil {
		return fmt.Errorf("signal bridge: hello: %w", err)
	}

	var lastStep int64 = -1
	open := map[string]*bridgeRequest{} // requests signalled, marker not seen yet
	// The marker is polled only while a request is open: an idle bridge
	// does not wake up.
	ticker := time.NewTicker(b.Poll)
	ticker.Stop()
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return errors.New("connection closed by the agent")
			}
			switch m.Type {
			case protocol.TypeWelcome:
				if m.Resume != nil {
					lastStep = m.Resume.Step
				}
			case protocol.TypeCheckpoint:
				pid, err := b.signal(m)
				if err != nil {
					// The agent logs the failure ("trainer could not save
					// the checkpoint", with this error): one line per event.
					send(protocol.Message{Type: protocol.TypeFailed, ID: m.ID, Error: err.Error()})
					continue
				}
				open[m.ID] = &bridgeRequest{id: m.ID, name: b.requestName(m.Dir), deadline: derefTime(m.Deadline), pid: pid}
				ticker.Reset(b.Poll)
			case protocol.TypeCommitted:
				if m.Step != nil && *m.Step > lastStep {
					lastStep = *m.Step
				}
			case protocol.TypeStop:
				if pid := b.PID(); pid > 0 {
					b.Log.Info("signal fallback: stop, SIGTERM to the trainer", zap.Int("pid", pid), zap.String("reason", m.Reason))
					syscall.Kill(-pid, syscall.SIGTERM)
				}
			case protocol.TypeError:
				b.Log.Warn("signal fallback: agent reported an error", zap.String("id", m.ID), zap.String("error", m.Error))
			}
		case now := <-ticker.C:
			for id, r := range open {
				step, state := r.check(b.Area, lastStep)
				if state == markerMissing {
					// Dropped when the trainer exited or restarted, or at
					// the deadline: the agent has settled it either way.
					if b.PID() != r.pid || (!r.deadline.IsZero() && now.After(r.deadline)) {
						delete(open, id)
					}
					continue
				}
				if state == markerUnreadable {
					b.Log.Warn("signal fallback: done marker without a step number: numbering it", zap.String("id", id), zap.Int64("step", step))
				}
				delete(open, id)
				lastStep = max(lastStep, step)
				if err := send(protocol.Message{Type: protocol.TypeDone, ID: id, Step: &step}); err != nil {
					return fmt.Errorf("signal bridge: done: %w", err)
				}
			}
			if len(open) == 0 {
				ticker.Stop()
				b.Area.Remove(RequestFile)
			}
		}
	}
}

// signal writes the request file, then signals the child, unless the child
// would die of the signal: a process that has not installed a handler yet.
func (b *Bridge) signal(m protocol.Message) (int, error) {
	pid := b.PID()
	if pid <= 0 {
		return 0, errors.New("trainer not running")
	}
	if caught, known := signalCaught(pid, b.Sig); known && !caught {
		return 0, fmt.Errorf("trainer (pid %d) has no %s handler (yet): not signalled, it would have died of it", pid, Name(b.Sig))
	}
	body, err := json.MarshalIndent(signalRequest{ID: m.ID, Dir: m.Dir, Reason: m.Reason, Deadline: derefTime(m.Deadline)}, "", "  ")
	if err != nil {
		return 0, err
	}
	// Through a temp file created with O_EXCL and renamed: a symlink
	// planted at either name is never followed.
	if err := checkpoint.WriteFile(b.Area, RequestFile, body, 0o600); err != nil {
		return 0, fmt.Errorf("write %s: %w", RequestFile, err)
	}
	if err := syscall.Kill(pid, b.Sig); err != nil {
		return 0, fmt.Errorf("signal %s to pid %d: %w", Name(b.Sig), pid, err)
	}
	b.Log.Info("signal fallback: trainer signalled", zap.String("id", m.ID), zap.Int("pid", pid), zap.String("signal", Name(b.Sig)))
	return pid, nil
}

// requestName is dir relative to the agent's area ("" if outside it: no
// marker will be found there).
func (b *Bridge) requestName(dir string) string {
	rel, err := filepath.Rel(b.AreaPath, dir)
	if err != nil || checkpoint.SafeRel(filepath.ToSlash(rel)) != nil {
		return ""
	}
	return filepath.ToSlash(rel)
}

type bridgeRequest struct {
	id       string
	name     string // the request's directory, in the agent's area
	deadline time.Time
	pid      int // the process signalled
	sawEmpty bool
}

type markerState int

const (
	markerMissing markerState = iota
	markerStep
	markerUnreadable
)

// check looks for the done marker. Its content is the step: a number, or
// {"step": N}. An empty marker is read again once (the trainer may create
// it before writing), then numbered after the last step known.
// The marker is opened without blocking (a FIFO there would hang the
// bridge) and must be a regular file.
func (r *bridgeRequest) check(area *os.Root, lastStep int64) (int64, markerState) {
	if r.name == "" {
		return 0, markerMissing
	}
	p := r.name + "/" + DoneMarker
	f, err := area.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, markerMissing
	}
	var b []byte
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		b, _ = io.ReadAll(io.LimitReader(f, 256))
	}
	f.Close()
	s := strings.TrimSpace(string(b))
	if s == "" && !r.sawEmpty {
		r.sawEmpty = true
		return 0, markerMissing
	}
	area.Remove(p) // the marker is not part of the checkpoint
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
		return n, markerStep
	}
	var v struct {
		Step *int64 `json:"step"`
	}
	if json.Unmarshal([]byte(s), &v) == nil && v.Step != nil && *v.Step >= 0 {
		return *v.Step, markerStep
	}
	return lastStep + 1, markerUnreadable
}

// signalCaught tells whether pid has a handler installed for sig, from
// /proc/PID/status (SigCgt); known is false where that cannot be read.
func signalCaught(pid int, sig syscall.Signal) (caught, known bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, false
			}
			return mask&(1<<(uint(sig)-1)) != 0, true
		}
	}
	return false, false
}

// Parse accepts the signals a trainer may be asked to checkpoint with.
func Parse(s string) (syscall.Signal, error) {
	switch strings.TrimPrefix(strings.ToUpper(s), "SIG") {
	case "USR1":
		return syscall.SIGUSR1, nil
	case "USR2":
		return syscall.SIGUSR2, nil
	}
	// Not SIGHUP: many runtimes (Go, the JVM, torchrun) catch it and
	// still terminate, which the handler check cannot tell.
	return 0, fmt.Errorf("want SIGUSR1 or SIGUSR2, got %q", s)
}

// Name names the signals a trainer may be sent (--signal,
// --notice-signal) as the flags spell them; 0 is "none".
func Name(sig syscall.Signal) string {
	switch sig {
	case 0:
		return "none"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGUSR1:
		return "SIGUSR1"
	case syscall.SIGUSR2:
		return "SIGUSR2"
	}
	return sig.String()
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
