package testutil

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// FreePorts returns n distinct TCP ports nobody listened on a moment ago,
// for a program the test starts that binds a port it is given (torchrun's
// MASTER_PORT, a control plane's). They are drawn below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), never from it: a port
// from 127.0.0.1:0 is an ephemeral one, which any outgoing connection on
// the machine (another test's connection flood) may take as its local
// port before the program binds it (EADDRINUSE).
func FreePorts(n int) ([]int, error) {
	lo := ephemeralLow()
	const floor = 10000
	if lo-floor < 1000 {
		return listenPorts(n) // no room below the ephemeral range
	}
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("no free port below %d after %d tries", lo, tries)
		}
		p := floor + rand.IntN(lo-floor)
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p)) // every address, as the program will
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (32768:
// Linux's default, where /proc does not say).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

func listenPorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreeAddr is a loopback address nobody listens on yet, for a server the
// test starts in-process or in a program that binds what it is given at
// once (an agent's --metrics-addr).
func FreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Scrape is one sample's value from the Prometheus text at
// http://addr/metrics: metric is its name with its labels as the text
// writes them (`spotagent_notices_total{cloud="aws",kind="termination"}`).
func Scrape(t *testing.T, addr, metric string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("metric %s not in /metrics", metric)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
