package liveness

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Mux is one UDP socket shared by the monitors of every run a node agent
// hosts (spotagent node: one agent per machine, a node of many jobs).
// Each packet goes to the monitor of its run and addressee, read from the
// body before its seal is checked: the monitor checks the seal with its
// own job's token, so a packet routed by a forged header is dropped there,
// as on a socket of its own.
type Mux struct {
	conn *net.UDPConn
	done chan struct{}

	mu   sync.Mutex
	subs map[muxKey]chan datagram
}

type muxKey struct {
	run  string
	node int
}

// datagram is one packet and where it came from.
type datagram struct {
	b    []byte
	from *net.UDPAddr
}

// muxQueue is how many packets wait for a monitor before more are
// dropped (each monitor reads at once; two neighbours send one each per
// interval).
const muxQueue = 64

// Listen opens the shared socket on addr (host:port, ":0" for a port of
// the kernel's choice).
func Listen(addr string) (*Mux, error) {
	la, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("liveness: listen %s: %w", addr, err)
	}
	conn, err := net.ListenUDP("udp", la)
	if err != nil {
		return nil, fmt.Errorf("liveness: listen %s: %w", addr, err)
	}
	x := &Mux{conn: conn, done: make(chan struct{}), subs: map[muxKey]chan datagram{}}
	go x.receive()
	return x, nil
}

// Addr is the local address heartbeats arrive on.
func (x *Mux) Addr() *net.UDPAddr { return x.conn.LocalAddr().(*net.UDPAddr) }

// Close closes the socket once its monitors are done with it.
func (x *Mux) Close() error {
	err := x.conn.Close()
	<-x.done
	return err
}

// join routes the packets of run addressed to node to the channel
// returned, until leave; one monitor per run and node.
func (x *Mux) join(run string, node int) (<-chan datagram, func(), error) {
	k := muxKey{run, node}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.subs[k] != nil {
		return nil, nil, fmt.Errorf("liveness: run %q node %d already heartbeats on %s", run, node, x.Addr())
	}
	ch := make(chan datagram, muxQueue)
	x.subs[k] = ch
	leave := func() {
		x.mu.Lock()
		if x.subs[k] == ch {
			delete(x.subs, k)
		}
		x.mu.Unlock()
	}
	return ch, leave, nil
}

// receive routes packets until the socket closes.
func (x *Mux) receive() {
	defer close(x.done)
	buf := make([]byte, maxPacket+1)
	for {
		n, from, err := x.conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		k, ok := route(buf[:n])
		if !ok {
			continue
		}
		x.mu.Lock()
		ch := x.subs[k]
		x.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case ch <- datagram{b: append([]byte(nil), buf[:n]...), from: from}:
		default: // a lost heartbeat is what the timeout allows for
		}
	}
}

// route reads a packet's run and addressee without checking its seal.
func route(pkt []byte) (muxKey, bool) {
	if len(pkt) > maxPacket || len(pkt) < len(magic)+macSize || string(pkt[:len(magic)]) != magic {
		return muxKey{}, false
	}
	var b struct {
		Run string `json:"run"`
		To  int    `json:"to"`
	}
	if err := json.Unmarshal(pkt[len(magic)+macSize:], &b); err != nil {
		return muxKey{}, false
	}
	return muxKey{b.Run, b.To}, true
}
