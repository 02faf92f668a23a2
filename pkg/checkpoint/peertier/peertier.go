// Package peertier lets a node of a multi-node job restore files of the
// checkpoint the store chose from another node's local tier instead of
// the store (docs/distributed.md, "Restore from a peer").
//
// Each agent runs a small HTTP/1.1 server that serves only files of its
// own local tier (localtier, through checkpoint.OpenRegular below one
// os.Root), and publishes where it listens and which checkpoints its tier
// holds in the run's store (peers/<node>.json). A restoring node's Client
// is one more checkpoint.Tier, asked after the local tier and before the
// store: for a file of its part it asks a peer whose part lists a file of
// the same size and CRC32C (data-parallel replicas write identical files)
// and, with --restore all, the owner of another part for that part's
// files. What a peer sends is verified by restore like any download; a
// file that is refused, stalls, is too slow (MinRate) or fails
// verification comes from the store. The choice of the checkpoint stays the store's: a peer can make
// a restore faster, never older or different.
//
// Only the job's agents can read: every request carries an HMAC-SHA256,
// keyed with the job's secret (liveness.Token: liveness/token in the
// store, created if absent, readable only with the job's store
// credentials), of the run, the node asked and its session (from its
// record), the checkpoint, the file, its part, its size and an expiry.
// The server refuses any other request, and one for another node or
// session.
package peertier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/connlimit"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/liveness"
)

// DefaultStall bounds a transfer that makes no progress (no answer, no
// byte of the body) for this long: then the file comes from the store.
const DefaultStall = 10 * time.Second

// Local is what a node serves its peers from: its local tier.
type Local interface {
	checkpoint.Tier
	// Held lists the checkpoints it holds (<step:012d>-<id>).
	Held() []string
}

// Config sets up one node's peer tier.
type Config struct {
	Store   cloud.Store // the run's store: the secret and the records
	RunID   string
	Node    string // this node's part, node-<k>
	Session string
	// Listen is the TCP address the server listens on (":0": a port of
	// the kernel's choice, published in the record).
	Listen string
	// Shared, when set, serves this node on that listener (node mode's
	// one listener for every hosted run) instead of one of its own:
	// Listen is then unused.
	Shared *Listener
	// Advertise are the hosts the other nodes reach this one at; empty:
	// every address of the machine (liveness.Advertise).
	Advertise []string
	// Local is this node's local tier: what the server serves. nil: the
	// node serves nothing, and only asks.
	Local Local
	Stall time.Duration // default DefaultStall
	// PeerWait bounds how long a restore waits, in all, for peers whose
	// records hold the checkpoint but whose addresses cannot be reached
	// (agents still starting: wait.go): 0, DefaultPeerWait; negative, none.
	PeerWait time.Duration
	// Replicas 1: after each commit, copy another node's part into the
	// local tier, from that node, so that a sharded part has a copy on
	// another machine: one in another zone, else of another instance
	// type, else the ring's next (placement.go). Needs a Local that can
	// add parts (localtier). 0: none.
	Replicas int
	// Machine is this node's machine, from its metadata: published in
	// the record, for the operator and the other nodes. (The placement
	// reads the machines from the manifest, PartInfo.Source.)
	Machine checkpoint.Machine
	// Network is where the server listens and the clients dial: nil,
	// the machine's TCP. A test inside a synctest bubble (the agent's
	// simulation) passes an in-memory one (internal/testutil/memnet).
	// With Shared, the clients dial on it; the server is Shared's.
	Network Network
	Log     *zap.Logger
}

// Network listens and dials TCP addresses ("host:port").
type Network interface {
	Listen(addr string) (net.Listener, error)
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// listen listens on c.Listen, on c.Network when set.
func (c Config) listen() (net.Listener, error) {
	if c.Network != nil {
		return c.Network.Listen(c.Listen)
	}
	return net.Listen("tcp", c.Listen)
}

// Node is one agent's peer tier: its server, and the Client its restores ask.
type Node struct {
	cfg   Config
	token []byte
	ln    net.Listener // its own, or the Shared one's
	srv   *http.Server // nil on a Shared listener
	// serving answers the requests for this node's files.
	serving *server
	log     *zap.Logger
	life    context.Context // ends with Close: the replica copies
	end     context.CancelFunc
	wg      sync.WaitGroup
	// turn is one record write at a time: a channel, not a mutex, so
	// that a Publish waiting behind a slow one gives up with its context
	// (and is durably blocked inside a synctest bubble: the agent's
	// simulation, where a mutex held across a slow store write stopped
	// the bubble's clock).
	turn chan struct{}

	repMu     sync.Mutex
	repCancel context.CancelFunc // the replica copy in flight; nil: none
}

// Start reads (or creates) the job's secret, starts the server and
// publishes this node's record. The server stops with Close.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if !checkpoint.ValidID(cfg.Node) {
		return nil, fmt.Errorf("peer tier: node %q is not a valid part name", cfg.Node)
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultStall
	}
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.PeerWait == 0 {
		cfg.PeerWait = DefaultPeerWait
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	token, err := liveness.Token(ctx, cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("peer tier: %w", err)
	}
	n := &Node{cfg: cfg, token: token, log: log, turn: make(chan struct{}, 1)}
	n.serving = &server{token: token, run: cfg.RunID, node: cfg.Node, session: cfg.Session, local: cfg.Local, stall: cfg.Stall, log: log,
		slots: make(chan struct{}, maxServing), shared: cfg.Shared != nil, warn: connlimit.NewWarnings(log)}
	if cfg.Shared != nil {
		if err := cfg.Shared.add(cfg.RunID, cfg.Node, n.serving); err != nil {
			return nil, err
		}
		n.ln = cfg.Shared.ln
	} else {
		ln, err := cfg.listen()
		if err != nil {
			// The previous session's record may still name this port
			// (now another program's, or nobody's): withdraw it, so
			// that no peer is sent there.
			withdraw := Record{Node: cfg.Node, Session: cfg.Session, Updated: time.Now().UTC()}
			if werr := putRecord(ctx, cfg.Store, withdraw); werr != nil {
				log.Warn("peer tier: record not withdrawn: peers may try its old address, then the store", zap.Error(werr))
			}
			return nil, fmt.Errorf("peer tier: %w", err)
		}
		n.ln = bound(ln, log) // limits.go
		n.srv = newServer(n.serving)
		n.wg.Go(func() {
			if err := n.srv.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("peer tier: server stopped", zap.Error(err))
			}
		})
	}
	n.life, n.end = context.WithCancel(context.Background())
	if err := n.Publish(ctx); err != nil {
		log.Warn("peer tier: record not written: peers restore from the store", zap.Error(err))
	}
	return n, nil
}

// Addr is where the server listens.
func (n *Node) Addr() *net.TCPAddr { return n.ln.Addr().(*net.TCPAddr) }

// Tier is the tier one restore asks: the other nodes' copies, their
// records read afresh, a peer still starting waited for (PeerWait).
func (n *Node) Tier() *Client {
	c := n.client()
	c.waiting = restoreWait{bound: max(n.cfg.PeerWait, 0), session: n.cfg.Session}
	return c
}

// client is a Client of this node that waits for no peer.
func (n *Node) client() *Client {
	c := NewClient(n.cfg.Store, n.cfg.RunID, n.cfg.Node, n.token, n.cfg.Stall, n.log)
	if n.cfg.Network != nil {
		c.dialVia(n.cfg.Network.DialContext)
	}
	return c
}

// Publish writes this node's record: its addresses and what its local
// tier holds now. Call it again whenever the tier keeps a new copy.
func (n *Node) Publish(ctx context.Context) error {
	select {
	case n.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("write record: %w", ctx.Err())
	}
	defer func() { <-n.turn }()
	rec := Record{Node: n.cfg.Node, Session: n.cfg.Session, Addrs: liveness.Advertise(n.advertise(), n.Addr().Port),
		Replicas: n.cfg.Replicas, Updated: time.Now().UTC()}
	if n.cfg.Machine != (checkpoint.Machine{}) {
		rec.Machine = &n.cfg.Machine
	}
	if n.cfg.Local != nil {
		rec.Holds = n.cfg.Local.Held()
	}
	if err := putRecord(ctx, n.cfg.Store, rec); err != nil {
		return err
	}
	if n.cfg.Local == nil {
		// The agent warned at its start that it serves nothing (localdirs).
		n.log.Debug("peer tier: record published: this node serves nothing, and only asks", zap.Strings("addrs", rec.Addrs))
	} else {
		n.log.Info("peer tier: serving this node's local copies", zap.Strings("addrs", rec.Addrs), zap.Strings("holds", rec.Holds))
	}
	return nil
}

// advertise is the hosts the record names: Advertise; else, when the
// server listens on one address (--peer-listen 127.0.0.1:0), that one,
// not the machine's others, where nothing listens; else none (every
// address of the machine).
func (n *Node) advertise() []string {
	if len(n.cfg.Advertise) > 0 {
		return n.cfg.Advertise
	}
	if ip := n.Addr().IP; ip != nil && !ip.IsUnspecified() {
		return []string{ip.String()}
	}
	return nil
}

// Close stops the server: transfers in flight end (their readers fall
// back to the store). On a Shared listener, the node is no longer
// served; its transfers in flight end within the stall bound.
func (n *Node) Close() {
	n.end()
	if n.srv != nil {
		n.srv.Close()
	} else {
		n.cfg.Shared.remove(n.cfg.RunID, n.cfg.Node, n.serving)
	}
	n.wg.Wait()
}
