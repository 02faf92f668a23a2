package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// fakeAgent accepts one connection and hands it to serve, which plays the
// agent's side by hand.
func fakeAgent(t *testing.T, serve func(c net.Conn, r *bufio.Reader)) string {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t), "a.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c, bufio.NewReader(c))
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return path
}

func readType(r *bufio.Reader) string {
	line, _ := r.ReadBytes('\n')
	var m Message
	json.Unmarshal(line, &m)
	return m.Type
}

func TestClient_Status(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) {
			if readType(r) == TypeStatus {
				c.Write([]byte(`{"type":"status","status":{"run_id":"x"}}` + "\n"))
			}
		})
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		raw, err := cl.Status(context.Background())
		if got, want := string(raw), `{"run_id":"x"}`; err != nil || got != want {
			t.Fatalf("status=%s err=%v, want %s", got, err, want)
		}
	})
	t.Run("HelloThenAgain", func(t *testing.T) {
		var seen []string
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) {
			seen = append(seen, readType(r))
			c.Write([]byte(`{"type":"error","error":"say hello first"}` + "\n"))
			seen = append(seen, readType(r), readType(r))
			c.Write([]byte(`{"type":"welcome"}` + "\n" + `{"type":"status","status":{}}` + "\n"))
		})
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Status(context.Background()); err != nil {
			t.Fatalf("status: %v", err)
		}
		if got, want := strings.Join(seen, ","), "status,hello,status"; got != want {
			t.Fatalf("agent saw %s, want %s", got, want)
		}
	})
	t.Run("ErrNoAgent", func(t *testing.T) {
		_, err := Dial(context.Background(), filepath.Join(testutil.ShortDir(t), "none.sock"))
		if err == nil || !strings.Contains(err.Error(), "no agent listening") {
			t.Fatalf("err=%v, want no agent listening", err)
		}
	})
}

func TestClient_Recv(t *testing.T) {
	t.Run("ErrLineTooLong", func(t *testing.T) {
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) {
			c.Write(bytes.Repeat([]byte("x"), maxLine+1))
			readType(r) // until the client closes
		})
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Recv(context.Background()); !errors.Is(err, ErrLineTooLong) {
			t.Fatalf("err=%v, want ErrLineTooLong", err)
		}
	})
	t.Run("MaxLineOK", func(t *testing.T) {
		head, tail := `{"type":"stop","error":"`, `"}`+"\n"
		line := head + strings.Repeat("x", maxLine-len(head)-len(tail)) + tail
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) {
			c.Write([]byte(line))
			readType(r)
		})
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if m, err := cl.Recv(context.Background()); err != nil || m.Type != TypeStop {
			t.Fatalf("line of MaxLine bytes: type %q, err %v; want stop", m.Type, err)
		}
	})
	t.Run("ErrBadMessage", func(t *testing.T) {
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) {
			c.Write([]byte("not json\n{\"type\":\"stop\"}\n"))
			readType(r)
		})
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Recv(context.Background()); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("err=%v, want ErrBadMessage", err)
		}
		if m, err := cl.Recv(context.Background()); err != nil || m.Type != TypeStop {
			t.Fatalf("next: %+v, %v; want stop", m, err)
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		path := fakeAgent(t, func(c net.Conn, r *bufio.Reader) { readType(r) })
		cl, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		if _, err := cl.Recv(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("err=%v, want context.Canceled", err)
		}
	})
}
