// Package liveness tells the agent of one node of a multi-node job when a
// neighbouring node's agent has gone silent: its machine stopped answering
// (a reclaimed VM, a partition), with no RST for the ranks to see.
//
// The agents heartbeat each other over UDP, beside the training loop and
// never inside it: what is watched is the agent process, so a slow save, a
// data-loader stall, a straggler, a GC pause or a long collective of the
// ranks cannot look like a loss. Node k heartbeats its ring neighbours
// k-1 and k+1 (mod the node count) every Interval and reports one of them
// silent when nothing valid came from it for Timeout: O(N) messages for
// the job, no coordinator. A node that finds a neighbour silent ends its
// own ranks; their connections close, and the other nodes' ranks fail
// with RSTs at once (the path docs/distributed.md calls a lost peer).
//
// The agents find each other through the run's store: each writes
// liveness/node-<k>.json (its addresses and session) and then reads its
// neighbours' records. A record that is missing or stale (an earlier
// incarnation) costs nothing: the neighbour writes its own before it reads
// ours, so the later of the two always finds the other, and the earlier
// one learns the later one's address from its first heartbeat. The store
// sees at most five requests per node at start (the token, the record, two
// neighbours' records) and none after.
//
// Every packet carries an HMAC-SHA256 keyed with the job's token
// (liveness/token, created if absent by the first agent and read by the
// others), over the run id, the sender, the addressee, the sender's session
// and a sequence number that must grow: a pod that cannot read the store
// can neither forge a heartbeat nor replay one.
//
// A neighbour is watched only once it has been heard: a node that never
// came up is the rendezvous's business. One that leaves in order (Close)
// says so, and is not reported.
package liveness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Defaults (issue #51, measured in docs/distributed.md "Choosing the
// period and the timeout"): a heartbeat every 100 ms, a neighbour silent
// after 2 s (twenty heartbeats missed). A pause or a loss burst of 1 s
// leaves a gap of at most 1.1 s and scheduling noise, well short of 2 s;
// 5 % independent loss needs 19 heartbeats lost in a row (0.05^19); and
// the verdict comes 2.0–2.2 s after a neighbour's last heartbeat, so that
// a silent node ends the survivors in about 2.5 s.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultTimeout  = 2 * time.Second
)

// Config sets up one node's monitor.
type Config struct {
	Store   cloud.Store // the run's store: the token and address records
	RunID   string
	Node    int // this node's rank
	Nodes   int // nodes in the job (at least 2)
	Session string
	// Listen is the UDP address heartbeats arrive on (default ":0", a port
	// of the kernel's choice, published in the record).
	Listen string
	// Mux, when set, is the node agent's shared socket (Listen is then
	// not used): one UDP port for every run the node agent hosts.
	Mux *Mux
	// Advertise are the hosts (IPs or names) the other nodes reach this one
	// at; empty: every unicast address of the machine's interfaces that are
	// up, loopback only when there is no other.
	Advertise []string
	Interval  time.Duration // default DefaultInterval
	Timeout   time.Duration // default DefaultTimeout
	Log       *zap.Logger
}

// Silence reports a neighbour whose agent has not been heard since Since.
type Silence struct {
	Node    int
	Session string
	Since   time.Time
}

// Monitor heartbeats a node's ring neighbours and reports them silent.
type Monitor struct {
	cfg    Config
	conn   *net.UDPConn
	in     <-chan datagram // from the Mux; nil: this monitor reads conn
	silent chan Silence
	// unheardAfter: a neighbour whose record was read but who is not heard
	// this long after the start is worth a warning (a firewall on the UDP
	// port leaves the job unwatched, never falsely lost).
	unheardAfter time.Duration
	begun        time.Time
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	log          *zap.Logger

	mu      sync.Mutex
	token   []byte // nil until read from the store
	seq     uint64
	started int64
	peers   map[int]*peer
	closed  bool
	// checked is when the last check ran (zero: none yet); a check that
	// comes late found this monitor stalled (checkLocked).
	checked time.Time
}

// peer is what a node knows of one neighbour.
type peer struct {
	record  []*net.UDPAddr // from its record in the store
	addr    *net.UDPAddr   // where its last valid packet came from
	session string
	started int64
	seq     uint64
	heard   time.Time // zero: never heard, not watched
	left    bool      // it said it leaves
	silent  bool      // reported
	warned  bool      // not heard: said so
}

// Neighbours are node's ring neighbours among nodes, without duplicates
// (with two nodes, the other one; with one, none).
func Neighbours(node, nodes int) []int {
	var out []int
	for _, n := range []int{(node + nodes - 1) % nodes, (node + 1) % nodes} {
		if n != node && (len(out) == 0 || out[0] != n) {
			out = append(out, n)
		}
	}
	return out
}

// Start listens, then finds the neighbours and heartbeats them in the
// background until ctx ends or Close. It does no store I/O itself: that
// runs in the background (retried while it fails), so it may be called
// from an event loop.
func Start(ctx context.Context, cfg Config) (*Monitor, error) {
	if cfg.Store == nil || cfg.Nodes < 2 || cfg.Node < 0 || cfg.Node >= cfg.Nodes || cfg.Session == "" {
		return nil, fmt.Errorf("liveness: node %d of %d, session %q: want a store, at least 2 nodes and a session", cfg.Node, cfg.Nodes, cfg.Session)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Timeout < 2*cfg.Interval {
		return nil, fmt.Errorf("liveness: timeout %v must be at least two heartbeat intervals (%v)", cfg.Timeout, cfg.Interval)
	}
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	var (
		conn  *net.UDPConn
		in    <-chan datagram
		leave func()
	)
	if cfg.Mux != nil {
		var err error
		if in, leave, err = cfg.Mux.join(cfg.RunID, cfg.Node); err != nil {
			return nil, err
		}
		conn = cfg.Mux.conn
	} else {
		la, err := net.ResolveUDPAddr("udp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("liveness: listen %s: %w", cfg.Listen, err)
		}
		if conn, err = net.ListenUDP("udp", la); err != nil {
			return nil, fmt.Errorf("liveness: listen %s: %w", cfg.Listen, err)
		}
		leave = func() { conn.Close() } // ends receive
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &Monitor{
		cfg: cfg, conn: conn, in: in, cancel: cancel, log: cfg.Log.With(zap.Int("node", cfg.Node)),
		started: time.Now().UnixNano(), peers: map[int]*peer{}, unheardAfter: time.Minute, begun: time.Now(),
	}
	nb := Neighbours(cfg.Node, cfg.Nodes)
	m.silent = make(chan Silence, len(nb))
	for _, n := range nb {
		m.peers[n] = &peer{}
	}
	m.wg.Add(4)
	go func() { defer m.wg.Done(); m.discover(ctx) }()
	go func() { defer m.wg.Done(); m.receive(ctx) }()
	go func() { defer m.wg.Done(); m.beat(ctx) }()
	go func() { defer m.wg.Done(); <-ctx.Done(); leave() }()
	return m, nil
}

// Silent delivers each neighbour found silent, once.
func (m *Monitor) Silent() <-chan Silence { return m.silent }

// Addr is the local address heartbeats arrive on.
func (m *Monitor) Addr() *net.UDPAddr { return m.conn.LocalAddr().(*net.UDPAddr) }

// Close tells the neighbours this node leaves (so they do not report it)
// and stops. Ending Start's ctx instead stops without a word, as a
// vanished node does.
func (m *Monitor) Close() {
	m.mu.Lock()
	if !m.closed && m.token != nil {
		for i := 0; i < 3; i++ { // UDP: say it more than once
			m.sendLocked(true)
		}
	}
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

// discover reads (or creates) the job's token, publishes this node's
// record, then reads its neighbours'. Each step is retried while the
// store fails.
func (m *Monitor) discover(ctx context.Context) {
	token, err := retry(ctx, m.log, "read the job's liveness token", func() ([]byte, error) { return Token(ctx, m.cfg.Store) })
	if err != nil {
		return
	}
	m.mu.Lock()
	m.token = token
	m.mu.Unlock()
	rec := record{Node: m.cfg.Node, Session: m.cfg.Session, Started: m.started, Addrs: m.advertise()}
	if _, err := retry(ctx, m.log, "publish this node's liveness address", func() (struct{}, error) {
		return struct{}{}, putJSON(ctx, m.cfg.Store, recordKey(m.cfg.Node), rec)
	}); err != nil {
		return
	}
	m.log.Info("liveness: heartbeating the ring neighbours", zap.Strings("addrs", rec.Addrs),
		zap.Ints("neighbours", Neighbours(m.cfg.Node, m.cfg.Nodes)), zap.Duration("interval", m.cfg.Interval),
		zap.Duration("timeout", m.cfg.Timeout))
	for n := range m.peers {
		r, err := retry(ctx, m.log, "read a neighbour's liveness address", func() (*record, error) { return getRecord(ctx, m.cfg.Store, n) })
		if err != nil {
			return
		}
		if r == nil {
			continue // it publishes later, reads ours, and heartbeats first
		}
		var addrs []*net.UDPAddr
		for _, s := range r.Addrs {
			if a, err := net.ResolveUDPAddr("udp", s); err == nil {
				addrs = append(addrs, a)
			}
		}
		m.mu.Lock()
		m.peers[n].record = addrs
		m.mu.Unlock()
	}
}

// beat sends heartbeats and looks for silent neighbours every interval.
func (m *Monitor) beat(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.mu.Lock()
			now := time.Now() // the tick's own time may predate a stall
			if m.token != nil && !m.closed {
				m.sendLocked(false)
			}
			m.checkLocked(now)
			m.mu.Unlock()
		}
	}
}

// sendLocked sends one packet to each neighbour: to the address its
// packets come from, else to every address of its record.
func (m *Monitor) sendLocked(leave bool) {
	m.seq++
	for n, p := range m.peers {
		pkt := seal(m.token, body{Run: m.cfg.RunID, From: m.cfg.Node, To: n, Session: m.cfg.Session,
			Started: m.started, Seq: m.seq, Leave: leave})
		to := p.record
		if p.addr != nil {
			to = []*net.UDPAddr{p.addr}
		}
		for _, a := range to {
			m.conn.WriteToUDP(pkt, a) // a lost heartbeat is what the timeout allows for
		}
	}
}

// checkLocked reports the neighbours heard once and silent since Timeout.
//
// Silence counts only while this monitor ran: a check that comes more than
// two intervals after the previous one found this process stopped or
// starved (SIGSTOP, a frozen VM, a swap storm), and whatever its
// neighbours sent meanwhile may still wait in the socket's buffer, unread.
// The time it was away is forgiven (every heard time moves forward by it),
// so a pause of this node is never taken for its neighbours' silence.
func (m *Monitor) checkLocked(now time.Time) {
	if !m.checked.IsZero() {
		if away := now.Sub(m.checked) - m.cfg.Interval; away > m.cfg.Interval {
			for _, p := range m.peers {
				if p.heard.IsZero() {
					continue
				}
				if p.heard = p.heard.Add(away); p.heard.After(now) {
					p.heard = now
				}
			}
			if away >= 5*m.cfg.Interval { // shorter ones are a loaded machine's everyday
				m.log.Info("liveness: this agent was stalled; its neighbours' silence meanwhile is not counted",
					zap.Duration("stalled", away.Round(time.Millisecond)))
			}
		}
	}
	m.checked = now
	for n, p := range m.peers {
		if p.heard.IsZero() && !p.warned && len(p.record) > 0 && now.Sub(m.begun) > m.unheardAfter {
			p.warned = true
			m.log.Warn("liveness: a neighbour's agent is not heard: its loss would go unseen (is UDP reachable between the nodes?)",
				zap.Int("peer", n), zap.Stringers("peer_addrs", p.record), zap.Int("listen_port", m.Addr().Port))
		}
		if p.heard.IsZero() || p.left || p.silent || now.Sub(p.heard) < m.cfg.Timeout {
			continue
		}
		p.silent = true
		m.log.Warn("liveness: a neighbour's agent is silent", zap.Int("peer", n), zap.String("peer_session", p.session),
			zap.Duration("silent_for", now.Sub(p.heard).Round(time.Millisecond)))
		select {
		case m.silent <- Silence{Node: n, Session: p.session, Since: p.heard}:
		default: // an earlier report is still unread: it says enough
		}
	}
}

// receive accepts the neighbours' packets until the socket closes (or,
// on a Mux, until ctx ends).
func (m *Monitor) receive(ctx context.Context) {
	if m.in != nil {
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-m.in:
				m.mu.Lock()
				m.acceptLocked(d.b, d.from, time.Now())
				m.mu.Unlock()
			}
		}
	}
	buf := make([]byte, maxPacket+1)
	for {
		n, from, err := m.conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m.mu.Lock()
		m.acceptLocked(buf[:n], from, time.Now())
		m.mu.Unlock()
	}
}

// acceptLocked applies one packet if it is valid: sealed with the job's
// token, from a neighbour, to this node, of this run, and newer than the
// last one of that neighbour's session (a later session replaces it).
func (m *Monitor) acceptLocked(pkt []byte, from *net.UDPAddr, now time.Time) bool {
	if m.token == nil {
		return false
	}
	b, ok := open(m.token, pkt)
	if !ok || b.Run != m.cfg.RunID || b.To != m.cfg.Node {
		return false
	}
	p := m.peers[b.From]
	if p == nil {
		return false
	}
	switch {
	case b.Session == p.session:
		if b.Seq <= p.seq {
			return false // a replay, or reordered
		}
	case p.session == "" || b.Started > p.started:
		if p.session != "" {
			m.log.Info("liveness: a neighbour started again", zap.Int("peer", b.From), zap.String("peer_session", b.Session))
		}
		*p = peer{record: p.record, session: b.Session, started: b.Started}
	default:
		return false // an earlier session than the one heard
	}
	p.seq, p.addr = b.Seq, from
	if b.Leave {
		if !p.left {
			m.log.Info("liveness: a neighbour's agent left in order", zap.Int("peer", b.From))
		}
		p.left = true
		return true
	}
	if p.heard.IsZero() {
		m.log.Info("liveness: a neighbour heard", zap.Int("peer", b.From), zap.String("peer_session", b.Session),
			zap.Stringer("addr", from))
	}
	p.heard = now
	return true
}

// advertise lists the addresses this node's record gives.
func (m *Monitor) advertise() []string { return Advertise(m.cfg.Advertise, m.Addr().Port) }

// Advertise lists host:port for each of hosts; with no hosts, for every
// unicast address of the machine's interfaces that are up, loopback only
// when there is no other: where the other nodes of a job reach this one
// (the heartbeats' UDP port, the peer tier's TCP port).
func Advertise(hosts []string, port int) []string {
	p := strconv.Itoa(port)
	var out []string
	if len(hosts) > 0 {
		for _, h := range hosts {
			out = append(out, net.JoinHostPort(h, p))
		}
		return out
	}
	var loop []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsMulticast() {
			continue
		}
		hp := net.JoinHostPort(ipn.IP.String(), p)
		if ipn.IP.IsLoopback() {
			loop = append(loop, hp)
			continue
		}
		out = append(out, hp)
	}
	if len(out) == 0 {
		return loop
	}
	return out
}

// retry runs fn until it succeeds or ctx ends, 1 s apart doubling to 30 s.
func retry[T any](ctx context.Context, log *zap.Logger, what string, fn func() (T, error)) (T, error) {
	wait := time.Second
	for {
		v, err := fn()
		if err == nil {
			return v, nil
		}
		log.Warn("liveness: could not "+what+" (retrying)", zap.Duration("retry_in", wait), zap.Error(err))
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}
