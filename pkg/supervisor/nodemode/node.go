// Package nodemode is node mode (spotagent node): one socket for every
// trainer on the machine, one agent (pkg/supervisor) per run id, and in a
// multi-node job per (run id, node rank), each hosted by RunHosted.
package nodemode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/liveness"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// Config wires a node agent: one socket for every trainer on the
// machine, one run (store, journal, scheduler) per run id named in hello.
type Config struct {
	// StorePrefix is joined with each run id: a trainer that says
	// run_id "exp42" writes to StorePrefix/exp42 and nowhere else.
	StorePrefix    string
	OpenStore      func(ctx context.Context, uri string) (cloud.Store, error)
	CheckpointRoot string // each run's local directory is CheckpointRoot/<run id>
	Source         metadata.Source
	Identity       metadata.Identity
	Server         protocol.ServerConfig
	// Run is the template of every run's supervisor.Config (Keep, TermGrace, Margin,
	// OnRebalance, Metrics, Log); RunID, Store, CheckpointDir and Scheduler
	// are filled per run.
	Run          supervisor.Config
	NewScheduler func() *schedule.Scheduler
	Log          *zap.Logger
	// PeerListen is the UDP address of the node agent's one heartbeat
	// socket (pkg/liveness): every multi-node run it hosts heartbeats its
	// job's other nodes through it, each a member of its own job's ring
	// (Run.Liveness sets the timeout and the advertised hosts; a timeout
	// < 0: no heartbeats, no socket). Default ":0".
	PeerListen string
	// AreaTTL is how long the area of a run the node no longer hosts is
	// kept after its last use (areas.go): 0 is DefaultAreaTTL, < 0 never
	// by age. Now is the clock it is measured with (nil: time.Now).
	AreaTTL time.Duration
	Now     func() time.Time
	// diskFree, when set, stands for the checkpoint root's filesystem
	// (avail, total bytes) in tests.
	diskFree func() (uint64, uint64, error)
}

// nodeRun is one run served by the node agent, owned by its goroutine.
// owner and conns belong to the dispatcher.
type nodeRun struct {
	id      string
	events  chan protocol.Event
	notices chan metadata.Notice
	signals chan os.Signal
	gone    chan struct{}                 // closed when the run is retired
	asks    chan chan<- supervisor.Status // status requests, answered by the run's loop once its agent exists
	// failed is why the run could not start (or failed), set by its
	// goroutine before it hands the run to finished; the dispatcher reads it
	// in retire. A hello queued too late for refuse gets the same refusal
	// there, not a new start of a run that just failed.
	failed error

	owner string // PeerIdentity of the peer whose hello claimed the run
	uid   int    // that peer's uid
	conns int    // connections that said hello to this run and are open
}

// Run serves trainers of any run until a shutdown signal has been
// handled by every run. A notice from the machine reaches every run.
// Cancelling ctx stops every run at once (as supervisor.Run's ctx does) and Run
// returns once they are all done. Run returns only when every
// goroutine it started has ended (see supervisor.Run for the exception).
func Run(ctx context.Context, cfg Config, signals <-chan os.Signal) error {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Server.Log == nil {
		cfg.Server.Log = log
	}
	cfg.Server.IdentifyPeers = true
	if cfg.Server.MaxConns <= 0 {
		cfg.Server.MaxConns = protocol.DefaultNodeMaxConns
	}
	root, err := openRoot(cfg)
	if err != nil {
		return err
	}
	defer root.Close()
	stopPeers, err := listenPeers(&cfg, log)
	if err != nil {
		return err
	}
	defer stopPeers()
	stopPeerTier, err := listenPeerTier(&cfg, log)
	if err != nil {
		return err
	}
	defer stopPeerTier()
	srv, stopServe, err := supervisor.ServeSocket(cfg.Server)
	if err != nil {
		return err
	}
	defer stopServe()

	n := &node{cfg: cfg, log: log, ctx: ctx, root: root, runs: map[string]*nodeRun{}, connRun: map[uint64]*nodeRun{}, evicted: map[uint64]bool{},
		finished: make(chan *nodeRun, 4)}
	notices := make(chan metadata.Notice, 16)
	nctx, stopWatch := context.WithCancel(ctx)
	defer n.wg.Wait()
	defer stopWatch()
	pruneTick := n.startAreas()
	defer pruneTick.Stop()
	if src := cfg.Source; src != nil {
		n.wg.Go(func() { src.Watch(nctx, notices) })
	}
	if m := cfg.Run.Metrics.RunMetrics; m != nil {
		m.Ready(true)
		defer m.Ready(false)
	}
	stopping := false
	cancelled := ctx.Done()
	for {
		if stopping && len(n.runs) == 0 {
			log.Info("node agent: every run is done")
			return nil
		}
		select {
		case <-cancelled:
			// Every run's loop sees ctx end and stops at once.
			log.Info("node agent: context ended", zap.Int("runs", len(n.runs)))
			stopping, cancelled = true, nil
		case ev := <-srv.Events():
			n.dispatch(ev)
		case no := <-notices:
			n.passNotice(no)
		case sig := <-signals:
			n.passSignal(sig)
			stopping = true
		case r := <-n.finished:
			n.retire(r)
		case <-pruneTick.C:
			n.areas.prune(n.hosted())
		}
	}
}

// openRoot makes and opens the checkpoint root. Each run's directory is
// made and opened through this handle, never by path: a pod that can
// write the hostPath cannot redirect one with a symlink planted at
// <root>/<run id> or <root>/<run id>/<node-K>.
func openRoot(cfg Config) (*os.Root, error) {
	if err := os.MkdirAll(cfg.CheckpointRoot, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	root, err := os.OpenRoot(cfg.CheckpointRoot)
	if err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	if len(cfg.Server.AllowUIDs) > 0 {
		// A trainer of another uid reaches the directory a request hands
		// it (pkg/supervisor handDir) through the root: search bit only.
		if err := localdirs.LetThrough(root); err != nil {
			root.Close()
			return nil, fmt.Errorf("checkpoint root: %w", err)
		}
	}
	return root, nil
}

// passNotice gives the machine's notice to every hosted run; a run whose
// queue is full misses it (logged).
func (n *node) passNotice(no metadata.Notice) {
	n.log.Info("node notice: passing it to every run", zap.String("kind", string(no.Kind)), zap.Int("runs", len(n.runs)))
	for _, r := range n.runs {
		select {
		case r.notices <- no:
		default:
			n.log.Warn("run busy: notice dropped", zap.String("run", r.id))
		}
	}
}

// passSignal gives the node agent's signal to every hosted run: each takes
// its final checkpoint.
func (n *node) passSignal(sig os.Signal) {
	n.log.Info("node agent: signal, final checkpoints for every run", zap.String("signal", sig.String()), zap.Int("runs", len(n.runs)))
	for _, r := range n.runs {
		select {
		case r.signals <- sig:
		default:
		}
	}
}

type node struct {
	cfg      Config
	log      *zap.Logger
	ctx      context.Context
	root     *os.Root // CheckpointRoot: every run's directory is made through it
	runs     map[string]*nodeRun
	connRun  map[uint64]*nodeRun
	evicted  map[uint64]bool // connections being closed for a full run queue
	finished chan *nodeRun
	wg       sync.WaitGroup // every goroutine the node starts
	areas    *areaPruner    // finished runs' areas (areas.go)
}

// startAreas sets up the pruning of finished runs' areas and prunes those
// an earlier node agent left; the ticker prunes again every areaPruneEvery.
func (n *node) startAreas() *time.Ticker {
	ttl, now := n.cfg.AreaTTL, n.cfg.Now
	if ttl == 0 {
		ttl = DefaultAreaTTL
	}
	if now == nil {
		now = time.Now
	}
	free := n.cfg.diskFree
	if free == nil {
		free = rootFree(n.root)
	}
	n.areas = &areaPruner{root: n.root, ttl: ttl, now: now, free: free, spawn: n.wg.Go, log: n.log}
	n.areas.leftovers()
	n.areas.prune(nil)
	return time.NewTicker(areaPruneEvery)
}

// hosted is the keys of the runs the node hosts now.
func (n *node) hosted() map[string]bool {
	h := make(map[string]bool, len(n.runs))
	for k := range n.runs {
		h[k] = true
	}
	return h
}

// dispatch routes a connection's event to its run; hello picks (or starts)
// it. It never waits on a run: one whose queue is full (a long restore, a
// stalled loop) costs the connection that sent the message, not the node.
func (n *node) dispatch(ev protocol.Event) {
	c, m := ev.Conn, ev.Msg
	if r, ok := n.connRun[c.ID()]; ok {
		if n.evicted[c.ID()] && m.Type != protocol.TypeDisconnected {
			return // closing: the rest of what it sent goes nowhere
		}
		switch m.Type {
		case protocol.TypeDisconnected:
			delete(n.connRun, c.ID())
			delete(n.evicted, c.ID())
			r.conns--
			n.deliverLater(r, ev)
		case protocol.TypeProgress:
			// Advisory: dropped when the run is busy.
			select {
			case r.events <- ev:
			default:
			}
		default:
			select {
			case r.events <- ev:
			default:
				n.evicted[c.ID()] = true
				n.log.Warn("node: run's queue is full: message dropped and its connection closed",
					zap.String("run", r.id), zap.String("type", m.Type), zap.Uint64("conn", c.ID()), zap.Int("queued", len(r.events)))
				c.SendNoWait(protocol.Message{Type: protocol.TypeError, ID: m.ID, Error: fmt.Sprintf("%s dropped: run %s is busy (its queue is full); closing connection", m.Type, r.id)}, true)
			}
		}
		return
	}
	switch m.Type {
	case protocol.TypeHello:
		n.hello(ev)
	case protocol.TypeStatus:
		n.status(c)
	case protocol.TypeDisconnected:
	default:
		c.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: m.Type + ": say hello with a run_id first"}, false)
	}
}

// nodeStatusWait bounds how long a status request waits for each run's
// loop; a run that has not answered by then (starting, or stalled) is
// listed without its status.
const nodeStatusWait = 2 * time.Second

// status answers c with every run's status. The runs' loops answer beside
// the dispatcher, which never waits on them.
func (n *node) status(c *protocol.Conn) {
	runs := make([]*nodeRun, 0, len(n.runs))
	for _, r := range n.runs {
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].id < runs[j].id })
	n.wg.Go(func() {
		ctx, cancel := context.WithTimeout(n.ctx, nodeStatusWait)
		defer cancel()
		sts := make([]*supervisor.Status, len(runs))
		var wg sync.WaitGroup
		for i, r := range runs {
			wg.Go(func() { sts[i] = r.askStatus(ctx) })
		}
		wg.Wait()
		out := supervisor.NodeStatus{Node: true, StorePrefix: n.cfg.StorePrefix, Runs: make([]supervisor.NodeRunStatus, 0, len(runs))}
		for i, r := range runs {
			out.Runs = append(out.Runs, supervisor.NodeRunStatus{Key: r.id, Status: sts[i]})
		}
		b, err := json.Marshal(out)
		if err != nil {
			c.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "status: " + err.Error()}, false)
			return
		}
		c.SendNoWait(protocol.Message{Type: protocol.TypeStatus, Status: b}, false)
	})
}

// askStatus is r's status from its loop; nil when the run ended or did
// not answer before ctx ended.
func (r *nodeRun) askStatus(ctx context.Context) *supervisor.Status {
	reply := make(chan supervisor.Status, 1)
	select {
	case r.asks <- reply:
	case <-r.gone:
		return nil
	case <-ctx.Done():
		return nil
	}
	select {
	case st := <-reply:
		return &st
	case <-r.gone:
		return nil
	case <-ctx.Done():
		return nil
	}
}

// hello binds a connection to the run it names. While a run has open
// connections from one peer (a pod, or outside Kubernetes a uid), a hello
// for it from another peer is refused; once they are gone anyone may take
// it (a later pod of the same Job).
func (n *node) hello(ev protocol.Event) {
	c, m := ev.Conn, ev.Msg
	refuse := func(text string) { c.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: text}, true) }
	if !validRunID(m.RunID) {
		n.log.Warn("node: hello refused: bad run id", zap.String("run_id", m.RunID), zap.Uint64("conn", c.ID()), zap.Int("peer_uid", c.PeerUID()))
		refuse(fmt.Sprintf("hello: run_id %q refused: node mode needs a run id of %s", m.RunID, runIDRule))
		return
	}
	peer := c.PeerIdentity()
	part := jobPart(m)
	key := runKey(m.RunID, part)
	r, ok := n.runs[key]
	if o := n.liveOwner(m.RunID, part, peer, c.PeerUID()); o != nil {
		n.log.Warn("node: hello refused: run id in use by another peer", zap.String("run", o.id),
			zap.String("peer", peer), zap.String("owner", o.owner), zap.Int("owner_conns", o.conns), zap.Uint64("conn", c.ID()))
		refuse(fmt.Sprintf("hello: run_id %q refused: it is in use by another pod or user on this node (%d connections); it frees once they close", m.RunID, o.conns))
		return
	}
	if !ok {
		r = n.start(m.RunID, part)
	}
	select {
	case r.events <- ev:
	default:
		n.log.Warn("node: run's queue is full: hello refused", zap.String("run", r.id), zap.Uint64("conn", c.ID()), zap.Int("queued", len(r.events)))
		refuse(fmt.Sprintf("hello: run %s is busy (its queue is full); try again", r.id))
		return
	}
	if r.owner != peer {
		if r.owner != "" {
			n.log.Info("node: run id taken over by a new peer: the previous one has no connections left",
				zap.String("run", r.id), zap.String("peer", peer), zap.String("previous", r.owner))
		}
		r.owner, r.uid = peer, c.PeerUID()
	}
	n.connRun[c.ID()] = r
	r.conns++
}

// runIDRule is what validRunID accepts, for the refusal's message.
const runIDRule = "1 to 128 letters, digits, '-', '_' and '.', neither beginning nor ending with '.'"

// validRunID: a run id names a directory under the checkpoint root and a
// child of the store prefix, so node mode takes only a plain, visible name:
// none of "...", ".hidden" (hidden, and beside the node's own files) or
// "x." (the same directory as "x" on some filesystems and stores).
func validRunID(id string) bool {
	return checkpoint.ValidID(id) && id[0] != '.' && id[len(id)-1] != '.'
}

// liveOwner is a live run that a hello from peer (of uid) for run id
// (and part) may not join, nil when it may: a run belongs to one owner
// across all its parts. The same run and part, or the run as a whole
// while it runs as parts (or a part while it runs whole), with open
// connections of another peer are refused; parts of one job may come
// from several pods (one per node of the job), but never from two users.
func (n *node) liveOwner(id, part, peer string, uid int) *nodeRun {
	for _, r := range n.runs {
		if r.conns == 0 || r.owner == peer {
			continue
		}
		rid, rpart, _ := strings.Cut(r.id, "/")
		if rid != id {
			continue
		}
		if rpart == part || rpart == "" || part == "" || r.uid != uid {
			return r
		}
	}
	return nil
}

// deliverLater hands ev to r without blocking the dispatcher: at once if
// there is room, else from a goroutine that waits for room or the run's
// end. Used for disconnects, which a run must see to forget a trainer.
func (n *node) deliverLater(r *nodeRun, ev protocol.Event) {
	select {
	case r.events <- ev:
		return
	default:
	}
	n.wg.Go(func() {
		select {
		case r.events <- ev:
		case <-r.gone:
		}
	})
}

// start begins a run: its store, journal and restore happen in its own
// goroutine, so a slow restore delays only its own trainers.
func (n *node) start(id, part string) *nodeRun {
	key := runKey(id, part)
	r := &nodeRun{id: key, events: make(chan protocol.Event, protocol.EventBuffer), notices: make(chan metadata.Notice, 16),
		signals: make(chan os.Signal, 2), gone: make(chan struct{}), asks: make(chan chan<- supervisor.Status)}
	n.runs[key] = r
	uri := strings.TrimRight(n.cfg.StorePrefix, "/") + "/" + id
	log := n.log.With(zap.String("run", key))
	log.Info("node: new run", zap.String("store", uri))
	n.wg.Go(func() {
		defer func() { n.finished <- r }()
		defer func() {
			// A panic fails this run, not every run on the machine.
			if err := supervisor.Recovered(log, recover()); err != nil {
				n.refuse(r, log, err)
			}
		}()
		st, err := n.cfg.OpenStore(n.ctx, uri)
		if err != nil {
			n.refuse(r, log, fmt.Errorf("store %s: %w", uri, err))
			return
		}
		defer st.Close()
		rc := n.cfg.Run
		rc.RunID, rc.Store, rc.Command = id, st, nil
		rel := id
		if part != "" {
			// Two pods of one job may share this machine: each node of
			// the job is a run of its own, with a directory of its own.
			rel = id + "/" + part
		}
		rc.CheckpointDir = filepath.Join(n.cfg.CheckpointRoot, filepath.FromSlash(rel))
		dir, err := openRunDir(n.root, rel, len(n.cfg.Server.AllowUIDs) > 0)
		if err != nil {
			n.refuse(r, log, fmt.Errorf("checkpoint dir %s: %w", rc.CheckpointDir, err))
			return
		}
		rc.Source, rc.Identity, rc.EndWhenIdle, rc.Log = n.cfg.Source, n.cfg.Identity, true, log
		rc.FleetDir = id // the fleet's root is the store prefix
		if part != "" {
			rc.Node = part // one node of a multi-node job (job.go)
			log.Info("node: run is one node of a multi-node job", zap.String("part", part))
		}
		if n.cfg.NewScheduler != nil {
			rc.Scheduler = n.cfg.NewScheduler()
		}
		err = supervisor.RunHosted(n.ctx, rc, supervisor.Hosted{Dir: dir, Events: r.events, Notices: r.notices, Signals: r.signals, Asks: r.asks})
		if err != nil {
			n.refuse(r, log, err)
			return
		}
		log.Info("node: run done")
	})
	return r
}

// listenPeers opens the heartbeat socket every hosted run of a multi-node
// job shares (cfg.Run.Liveness.Mux), unless heartbeats are off.
func listenPeers(cfg *Config, log *zap.Logger) (stop func(), err error) {
	if cfg.Run.Liveness.Timeout < 0 {
		log.Info("node agent: no liveness heartbeats (--peer-timeout 0): a silent node of a multi-node job is bounded by its process group's timeout only")
		return func() {}, nil
	}
	addr := cfg.PeerListen
	if addr == "" {
		addr = ":0"
	}
	x, err := liveness.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("peer listen: %w", err)
	}
	cfg.Run.Liveness.Mux = x
	log.Info("node agent: heartbeats of hosted multi-node runs on one UDP socket", zap.Stringer("addr", x.Addr()))
	return func() { x.Close() }, nil
}

// listenPeerTier opens the TCP listener every hosted run of a multi-node
// job serves its local copies to its job's other nodes on
// (cfg.Run.PeerTier.Shared, pkg/checkpoint/peertier), when the peer tier
// is on: one port for the node agent, as the heartbeats' one socket.
func listenPeerTier(cfg *Config, log *zap.Logger) (stop func(), err error) {
	pc := &cfg.Run.PeerTier
	if !pc.Enabled {
		return func() {}, nil
	}
	addr := pc.Listen
	if addr == "" {
		addr = ":0"
	}
	l, err := peertier.Listen(addr, log)
	if err != nil {
		return nil, fmt.Errorf("peer tier listen: %w", err)
	}
	pc.Shared = l
	log.Info("node agent: hosted multi-node runs serve their local copies on one TCP listener", zap.Stringer("addr", l.Addr()))
	return l.Close, nil
}

// jobPart is the part a node agent's run commits, from the hello that
// starts it: "" unless the trainer is one node of several.
func jobPart(m protocol.Message) string {
	if m.NodeRank == nil || *m.NodeRank < 0 || !supervisor.MultiNode(m) {
		return ""
	}
	return supervisor.NodePart(*m.NodeRank)
}

// openRunDir creates rel below root one directory at a time, refusing
// symlinks and non-directories, and opens it. letThrough (--allow-uid)
// gives each level the search bit (localdirs.LetThrough), so that a
// trainer of another uid can reach the directory a request hands it.
func openRunDir(root *os.Root, rel string, letThrough bool) (*os.Root, error) {
	if err := checkpoint.SafeRel(rel); err != nil {
		return nil, err
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		level := strings.Join(parts[:i+1], "/")
		if err := localdirs.MkdirIn(root, level); err != nil {
			return nil, err
		}
		if !letThrough {
			continue
		}
		d, err := checkpoint.OpenDir(root, level)
		if err != nil {
			return nil, err
		}
		err = localdirs.LetThrough(d)
		d.Close()
		if err != nil {
			return nil, err
		}
	}
	return checkpoint.OpenDir(root, rel)
}

// runKey names a run of the node agent: its run id, and in a multi-node
// job its part (node-<k>), so that two pods of one job on one machine are
// two runs (two parts of each checkpoint), not one pod refused.
func runKey(id, part string) string {
	if part == "" {
		return id
	}
	return id + "/" + part
}

// refuse answers every trainer waiting on a run that could not start;
// retire answers those whose hello is queued after this (r.failed).
func (n *node) refuse(r *nodeRun, log *zap.Logger, err error) {
	log.Error("node: run could not start", zap.Error(err))
	r.failed = err
	for {
		select {
		case ev := <-r.events:
			if ev.Msg.Type == protocol.TypeHello {
				ev.Conn.Send(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + err.Error()})
				ev.Conn.Close()
			}
		default:
			return
		}
	}
}

// retire forgets a finished run; events that raced with its end are
// dispatched again (a hello then starts the run anew), except after a run
// that failed: its late hellos get its refusal, as those refuse answered
// did. Else a hello queued just after a run failed at once (a panic in
// its start) would start it again, once per late hello.
func (n *node) retire(r *nodeRun) {
	delete(n.runs, r.id) // r.id is the run's key
	close(r.gone)
	for id, cr := range n.connRun {
		if cr == r {
			delete(n.connRun, id)
			delete(n.evicted, id)
		}
	}
	for done := false; !done; {
		select {
		case ev := <-r.events:
			if r.failed == nil {
				n.dispatch(ev)
			} else if ev.Msg.Type == protocol.TypeHello {
				ev.Conn.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + r.failed.Error()}, true)
			}
		default:
			done = true
		}
	}
	// The run's area was used until now; a hello dispatched above may
	// have started the run again (then its area stays).
	n.areas.touch(r.id)
	n.areas.prune(n.hosted())
}
