package memnet

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// An HTTP server and client of two hosts, inside a bubble: the server
// sees the client's address, a response held by the server for a minute
// of fake time takes none of real time, and the bubble ends with every
// goroutine gone once both are closed.
func TestHTTPInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := New()
		ln, err := n.Host("10.0.0.1").Listen("10.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Minute)
			io.WriteString(w, r.RemoteAddr)
		})}
		go srv.Serve(ln)
		defer srv.Close()
		tr := &http.Transport{DialContext: n.Host("10.0.0.2").DialContext}
		defer tr.CloseIdleConnections()
		start := time.Now()
		resp, err := (&http.Client{Transport: tr}).Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		host, _, _ := net.SplitHostPort(string(body))
		if host != "10.0.0.2" {
			t.Errorf("the server saw the client at %q, want 10.0.0.2", body)
		}
		if d := time.Since(start); d != time.Minute {
			t.Errorf("the answer took %s of fake time, want 1m", d)
		}
		if _, ok := ln.Addr().(*net.TCPAddr); !ok {
			t.Errorf("Addr is a %T, want *net.TCPAddr", ln.Addr())
		}
	})
}

// Refused as the kernel refuses: nobody listening (never, or no more),
// or an address already taken.
func TestRefused(t *testing.T) {
	n := New()
	h := n.Host("10.0.0.1")
	ln, err := h.Listen(":7000")
	if err != nil {
		t.Fatal(err)
	}
	if got := ln.Addr().String(); got != "10.0.0.1:7000" {
		t.Errorf("Addr %s, want 10.0.0.1:7000", got)
	}
	if _, err := h.Listen("10.0.0.1:7000"); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second listen: %v, want EADDRINUSE", err)
	}
	if _, err := h.Listen("10.0.0.9:0"); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("listen on another host's address: %v, want EADDRNOTAVAIL", err)
	}
	c, err := n.Host("10.0.0.2").DialContext(context.Background(), "tcp", "10.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln.Close()
	for _, addr := range []string{"10.0.0.1:7000", "10.0.0.1:7001"} {
		_, err := n.Host("10.0.0.2").DialContext(context.Background(), "tcp", addr)
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial %s: %v, want a dial OpError, ECONNREFUSED", addr, err)
		}
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := h.Listen("10.0.0.1:7000"); err != nil {
		t.Errorf("the address is not free after Close: %v", err)
	}
}
