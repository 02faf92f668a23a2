package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/metadata/fake"
	"github.com/spotagent/spotagent/pkg/protocol"

	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
)

// A notice source fake plus how to expose one termination notice and
// withdraw it before the next agent starts.
type latencyCloud struct {
	name  string
	flags []string
	// expose makes a termination notice visible and returns when.
	expose func() time.Time
	reset  func()
	close  func()
}

func latencyClouds() ([]latencyCloud, error) {
	a, err := fake.StartAWS("127.0.0.1:0", fake.AWSOptions{})
	if err != nil {
		return nil, err
	}
	g, err := fake.StartGCP("127.0.0.1:0", fake.GCPOptions{})
	if err != nil {
		return nil, err
	}
	z, err := fake.StartAzure("127.0.0.1:0", fake.AzureOptions{})
	if err != nil {
		return nil, err
	}
	var azureEvent string
	return []latencyCloud{
		{
			name:  "aws",
			flags: []string{"--cloud", "aws", "--aws-imds-endpoint", a.URL()},
			expose: func() time.Time {
				return a.Terminate("terminate", time.Now().Add(2*time.Minute).Truncate(time.Second))
			},
			reset: a.ClearTermination, close: a.Close,
		},
		{
			name:   "gcp",
			flags:  []string{"--cloud", "gcp", "--gcp-metadata-host", g.Host()},
			expose: g.Preempt,
			reset:  func() { g.Set("instance/preempted", "FALSE") },
			close:  g.Close,
		},
		{
			name:  "azure",
			flags: []string{"--cloud", "azure", "--azure-metadata-endpoint", z.URL()},
			expose: func() time.Time {
				ev, t := z.Preempt()
				azureEvent = ev.EventId
				return t
			},
			reset: func() {
				if azureEvent != "" {
					z.RemoveEvent(azureEvent)
					azureEvent = ""
				}
			},
			close: z.Close,
		},
	}, nil
}

// benchLatency: per cloud, N agent runs (`spotagent sidecar`, the socket
// client below plays the trainer). Each exposes one termination notice at a
// random phase of the poll period and times fake exposure → `checkpoint`
// message read on the trainer's socket. An interruption ends the agent, so
// every notice is a fresh run: start-up is not measured, the agent's
// steady state is.
func benchLatency(c *config, r *report.Report) error {
	clouds, err := latencyClouds()
	if err != nil {
		return err
	}
	defer func() {
		for _, cl := range clouds {
			cl.close()
		}
	}()
	dir := filepath.Join(c.work, "latency")
	var body strings.Builder
	fmt.Fprintf(&body, "Fake metadata server exposes a termination notice → the `checkpoint` message is read on the trainer's socket, through the real binary (`spotagent sidecar`, a Go socket client as the trainer), %d notices per cloud, each in a fresh agent run, at a uniformly random phase of the poll period: %s for Azure, %s for AWS (`spot/instance-action` has its own cadence, `--aws-spot-poll-interval`; the other AWS paths are read every %s). GCP uses hanging GETs, so it has no poll phase.\n\n", c.notices, c.pollInterval, awsSpotPoll, c.pollInterval)
	body.WriteString("| cloud | notices | p50 ms | p90 ms | p99 ms | max ms | min ms | agent: notice → request logged, p50 ms |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, cl := range clouds {
		var lat, internal []float64
		for i := range c.notices {
			d, in, err := oneNotice(c, dir, cl, i)
			if err != nil {
				return fmt.Errorf("latency %s #%d: %w", cl.name, i, err)
			}
			lat = append(lat, stats.MS(d))
			if in >= 0 {
				internal = append(internal, stats.MS(in))
			}
		}
		lo, hi := stats.MinMax(lat)
		p99 := stats.Pct(lat, 0.99)
		fmt.Fprintf(&body, "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", cl.name, len(lat), stats.Median(lat), stats.Pct(lat, 0.9), p99, hi, lo, stats.Median(internal))
		logf("%s: p50 %.1f ms, p99 %.1f ms, max %.1f ms", cl.name, stats.Median(lat), p99, hi)
		limit := stats.MS(c.pollInterval) + 50
		want := fmt.Sprintf("p99 ≤ %.0f ms (poll interval + 50 ms)", limit)
		switch cl.name {
		case "gcp":
			limit, want = 100, "p99 ≤ 100 ms"
		case "aws":
			limit = stats.MS(awsSpotPoll) + 50
			want = fmt.Sprintf("p99 ≤ %.0f ms (spot poll interval + 50 ms)", limit)
		}
		r.Target(report.Target{Name: "notice → `checkpoint` message, " + cl.name, Want: want, Got: fmt.Sprintf("p99 %.1f ms (p50 %.1f)", p99, stats.Median(lat)),
			Met: p99 <= limit, Margin: fmt.Sprintf("%+.1f ms", limit-p99)})
	}
	body.WriteString("\nThe last column is the agent's own view (the notice's `detected` field → the \"checkpoint requested\" log line): the rest of the latency is the poll phase.\n")
	r.Add("1. Notice → `checkpoint` message latency", body.String())
	r.Command("spotagent sidecar --store file:///TMP/store --socket TMP/agent.sock --interval 1h --poll-interval 1s --log-format json --cloud aws --aws-imds-endpoint http://127.0.0.1:PORT   # (gcp: --gcp-metadata-host, azure: --azure-metadata-endpoint); fakes from pkg/metadata/fake in the bench process")
	return nil
}

// awsSpotPoll is the agent's default --aws-spot-poll-interval, which the
// bench leaves as it is.
const awsSpotPoll = 250 * time.Millisecond

// oneNotice runs one agent and returns exposure → `checkpoint` read, and
// the agent's logged detection → request (or -1).
func oneNotice(c *config, dir string, cl latencyCloud, i int) (time.Duration, time.Duration, error) {
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, 0, err
	}
	cl.reset()
	sock := filepath.Join(dir, "agent.sock")
	args := append([]string{"sidecar", "--store", "file://" + filepath.Join(dir, "store"), "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--socket", sock, "--interval", "1h", "--poll-interval", c.pollInterval.String(), "--log-format", "json"}, cl.flags...)
	cmd := exec.Command(c.bin, args...)
	logPath := filepath.Join(c.work, fmt.Sprintf("latency-%s.log", cl.name))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
	}()

	var conn *protocol.Client
	for deadline := time.Now().Add(15 * time.Second); ; {
		if conn, err = protocol.Dial(context.Background(), sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Signal(syscall.SIGKILL)
			return 0, 0, fmt.Errorf("socket never answered: %w (log %s)", err, logPath)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer conn.Close()
	read := func(want string, timeout time.Duration) (protocol.Message, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		for {
			m, err := conn.Recv(ctx)
			if errors.Is(err, protocol.ErrBadMessage) {
				continue
			}
			if err != nil {
				return m, fmt.Errorf("waiting for %s: %w (log %s)", want, err, logPath)
			}
			if m.Type == want {
				return m, nil
			}
		}
	}
	hctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = conn.Hello(hctx, protocol.Message{PID: os.Getpid()})
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("%w (log %s)", err, logPath)
	}
	// Let the source reach its steady state, then a random phase.
	time.Sleep(700*time.Millisecond + rand.N(c.pollInterval))
	exposed := cl.expose()
	m, err := read("checkpoint", 10*time.Second)
	lat := time.Since(exposed)
	if err != nil {
		return 0, 0, err
	}
	// Answer like a trainer so the agent commits and exits on its own.
	if err := os.WriteFile(filepath.Join(m.Dir, "state.bin"), []byte("x"), 0o644); err == nil {
		step := int64(1)
		conn.Send(context.Background(), protocol.Message{Type: protocol.TypeDone, ID: m.ID, Step: &step})
	}
	read("stop", 10*time.Second)
	conn.Close()
	// A sidecar keeps serving after an interruption (the pod goes away
	// around it): the figure is taken, end it.
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	exited <- nil
	return lat, agentRequestDelay(logPath), nil
}

// agentRequestDelay reads the agent's json log: the notice's detection time
// → the "checkpoint requested" line.
func agentRequestDelay(path string) time.Duration {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	var detected, requested time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			TS       string `json:"ts"`
			Msg      string `json:"msg"`
			Detected string `json:"detected"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Msg {
		case "interruption notice":
			detected = parseTS(l.Detected)
		case "checkpoint requested":
			if requested.IsZero() {
				requested = parseTS(l.TS)
			}
		}
	}
	if detected.IsZero() || requested.IsZero() {
		return -1
	}
	return requested.Sub(detected)
}

func parseTS(s string) time.Time {
	for _, layout := range []string{"2006-01-02T15:04:05.000Z0700", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	return time.Time{}
}
