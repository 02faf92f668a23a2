package peertier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// maxPeers bounds the peers asked for one file (and so the records read):
// at 1,000 nodes a replica file is listed by every part, and one or two
// peers that answer are enough.
const maxPeers = 4

// Client is the peer tier as restore sees it (checkpoint.Tier): it asks
// the other nodes of the job for files of the checkpoint restore chose.
type Client struct {
	st    cloud.Store
	run   string
	node  string
	token []byte
	stall time.Duration
	// minRate and grace: MinRate and Grace (tests lower them).
	minRate int64
	grace   time.Duration
	hc      *http.Client
	log     *zap.Logger

	mu      sync.Mutex
	records map[string]*Record   // by node, once read; nil: none
	bad     map[string]time.Time // addresses that failed, when: not asked again for badFor
	// refused are the nodes a copy of which failed verification (Refuse):
	// never asked again by this client, one restore's or one replica
	// copy's.
	refused map[string]bool
	placed  string            // the checkpoint whose keepers are in keepers
	keepers map[string]string // part → the node that keeps its copy

	waiting restoreWait        // the waits for peers still starting (wait.go)
	down    map[string]bool    // addresses the last dial could not reach
	rereads map[string]*Record // by node and the session that refused: reread's answer
}

// keeperOf is keeperOf(m, part), the placement computed once per checkpoint.
func (c *Client) keeperOf(m *checkpoint.Manifest, part string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ck := folder(m); c.placed != ck {
		c.placed, c.keepers = ck, map[string]string{}
		for i, j := range keeps(m.Parts) {
			c.keepers[m.Parts[j].Node] = m.Parts[i].Node
		}
	}
	return c.keepers[part]
}

// badFor is how long an address that failed is not asked again: the rest
// of a restore, not the agent's life (a peer's agent may come back).
const badFor = time.Minute

var _ checkpoint.Tier = (*Client)(nil)

// NewClient returns the peer tier of node (its own part is never asked
// for from itself), signing with token. It waits for no peer that is
// still starting: Node.Tier's client does.
func NewClient(st cloud.Store, run, node string, token []byte, stall time.Duration, log *zap.Logger) *Client {
	if stall <= 0 {
		stall = DefaultStall
	}
	if log == nil {
		log = zap.NewNop()
	}
	tr := &http.Transport{
		Proxy:                 nil, // a peer is on the job's network, never behind the environment's proxy
		DialContext:           (&net.Dialer{Timeout: min(stall, 5*time.Second)}).DialContext,
		ResponseHeaderTimeout: stall,
		MaxIdleConnsPerHost:   maxServing,
		DisableCompression:    true,
		IdleConnTimeout:       30 * time.Second,
		ReadBufferSize:        256 << 10, // large reads of the body go past it; the header's small ones do not
	}
	c := &Client{st: st, run: run, node: node, token: token, stall: stall, minRate: MinRate, grace: Grace, hc: &http.Client{Transport: tr}, log: log,
		records: map[string]*Record{}, bad: map[string]time.Time{}, refused: map[string]bool{}, down: map[string]bool{}, rereads: map[string]*Record{}}
	tr.DialContext = c.dialNoted(tr.DialContext)
	return c
}

// dialVia makes c dial with dial (a Config.Network's), within the bound
// NewClient gives the machine's dialer.
func (c *Client) dialVia(dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	bound := min(c.stall, 5*time.Second)
	c.hc.Transport.(*http.Transport).DialContext = c.dialNoted(func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		return dial(ctx, network, addr)
	})
}

// Name is checkpoint.FromPeer.
func (c *Client) Name() string { return checkpoint.FromPeer }

// candidate is a copy of a file's content in another node's part, or
// (replica) the copy of f's part another node keeps with --replicas.
type candidate struct {
	node    string
	file    checkpoint.File
	replica bool
}

// candidates lists, for f, the files of other nodes' parts of m with the
// same size and checksum (f itself, when it is another node's), at most
// one per node and maxPeers in all, the nodes after this one first (so
// that the replacements of several nodes spread over the survivors); then
// the node that keeps a replica of f's part (placement.go), if not listed.
func (c *Client) candidates(m *checkpoint.Manifest, f checkpoint.File) []candidate {
	seen := map[string]bool{}
	var out []candidate
	for _, g := range m.Files {
		if g.Part == "" || g.Part == c.node || seen[g.Part] || !sameContent(f, g) || c.isRefused(g.Part) {
			continue
		}
		seen[g.Part] = true
		out = append(out, candidate{node: g.Part, file: g})
	}
	slices.SortFunc(out, func(a, b candidate) int {
		ax, bx := a.node > c.node, b.node > c.node
		switch {
		case ax != bx && ax:
			return -1
		case ax != bx:
			return 1
		case a.node < b.node:
			return -1
		case a.node > b.node:
			return 1
		}
		return 0
	})
	if len(out) > maxPeers {
		out = out[:maxPeers]
	}
	if h := c.keeperOf(m, f.Part); h != "" && h != c.node && !seen[h] && !c.isRefused(h) {
		out = append(out, candidate{node: h, file: f, replica: true})
	}
	return out
}

// sameContent: the same size and digest, and checksum (a file without a
// digest is never read from a peer).
func sameContent(a, b checkpoint.File) bool {
	return a.Size == b.Size && a.HasDigest() && a.BLAKE3 == b.BLAKE3 && a.SHA256 == b.SHA256 && a.CRC32C == b.CRC32C
}

func (c *Client) isRefused(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused[node]
}

// refuse records that node's copy failed verification: it is not asked
// again by this client.
func (c *Client) refuse(node, addr string, err error) {
	c.mu.Lock()
	c.refused[node] = true
	c.mu.Unlock()
	c.log.Warn("peer tier: a peer's copy failed verification: not asking that peer again", zap.String("node", node), zap.String("addr", addr), zap.Error(err))
}

// Open returns a peer's copy of file f of checkpoint m, as a body bounded
// by the stall timeout and f's size; an error wrapping fs.ErrNotExist
// when no peer holds one (or f records no digest). Restore verifies what
// it reads against f's digest, and refuses a copy that fails
// (checkpoint.Refusable): that peer is not asked again by this client. A peer whose
// record holds m but whose addresses cannot be reached is waited for
// (await: its agent may be starting), within the restore's wait bound;
// one that refuses has its record read once more (reread: it may name a
// session that has just ended). When a new session's record comes of
// either, what the previous session's addresses did is dropped from the
// error: the new session's answer is why the file comes from the store.
func (c *Client) Open(ctx context.Context, m *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	if !f.HasDigest() {
		return nil, fmt.Errorf("peer: %s: %w: %w", f.Path, checkpoint.ErrNoDigest, fs.ErrNotExist)
	}
	ck := folder(m)
	var errs []error
	for _, cd := range c.candidates(m, f) {
		rec := c.record(ctx, cd.node)
		tried := map[string]bool{} // sessions asked: a record flipping between two never loops
		for rec != nil && !tried[rec.Session] && slices.Contains(rec.Holds, ck) && (!cd.replica || rec.Replicas >= 1) {
			tried[rec.Session] = true
			asked := len(errs)
			rc, how, err := c.openAt(ctx, rec, cd, ck, &errs)
			switch {
			case rc != nil || err != nil:
				return rc, err
			case how == peerDown:
				rec = c.await(ctx, cd.node, rec) // a new session's record, or nil: the next node
			case how == peerRefused:
				rec = c.reread(ctx, cd.node, rec)
			default:
				rec = nil // its copy is gone: the next node
			}
			if rec != nil {
				// The previous session's failures (its address refused, or
				// refused the signature) are not why the file may still
				// come from the store: the new session's answer is.
				errs = errs[:asked]
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("peer: no peer holds %s: %w", f.Path, fs.ErrNotExist)
	}
	return nil, fmt.Errorf("peer: %w", errors.Join(errs...))
}

// What asking a node at every address of its record came to, when no
// copy came of it.
const (
	peerGone    = iota // it answered that it holds no such copy, or has no address
	peerDown           // no address could be reached: its agent may be starting
	peerRefused        // an address answered with an error (403: another session's)
)

// openAt asks the node of rec, at each of its addresses, for cd's file of
// checkpoint ck, adding what failed to errs. An address marked bad by an
// earlier file's attempt is not asked again, and counts as it failed then.
func (c *Client) openAt(ctx context.Context, rec *Record, cd candidate, ck string, errs *[]error) (io.ReadCloser, int, error) {
	if len(rec.Addrs) == 0 {
		return nil, peerGone, nil
	}
	down := true
	for _, addr := range rec.Addrs {
		if c.isBad(addr) {
			down = down && c.isDown(addr)
			continue
		}
		rc, err := c.get(ctx, addr, target{cd.node, rec.Session}, ck, cd.file)
		if err == nil {
			return rc, 0, nil
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, peerGone, nil
		}
		down = down && (isDialError(err) || errors.Is(err, errNotHosted))
		*errs = append(*errs, fmt.Errorf("%s at %s: %w", cd.node, addr, err))
		c.forgive(cd.node, rec, addr)
	}
	if down {
		return nil, peerDown, nil
	}
	return nil, peerRefused, nil
}

// record is node's record, read once; nil when it has none or it is
// unreadable. The read holds no lock and is bounded (readRecord): a store
// GET that stalls costs that node's copies, never the other files.
func (c *Client) record(ctx context.Context, node string) *Record {
	c.mu.Lock()
	r, ok := c.records[node]
	c.mu.Unlock()
	if ok {
		return r
	}
	r, err := c.readRecord(ctx, node)
	if err != nil {
		c.log.Warn("peer tier: a peer's record is unreadable: its files come from the store", zap.String("node", node), zap.Error(err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.records[node]; ok {
		return cur // another file's read (or a wait's newer record) came first
	}
	if ctx.Err() == nil {
		c.records[node] = r
	}
	return r
}

// recordTimeout bounds one read of a peer's record, a small object: a
// store that stalls on it costs that peer's copies (the store instead),
// not the restore.
func (c *Client) recordTimeout() time.Duration { return min(c.stall, 5*time.Second) }

// readRecord reads node's record within recordTimeout.
func (c *Client) readRecord(ctx context.Context, node string) (*Record, error) {
	ctx, cancel := context.WithTimeout(ctx, c.recordTimeout())
	defer cancel()
	return getRecord(ctx, c.st, node)
}

func (c *Client) isBad(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.bad[addr]
	return ok && time.Since(t) < badFor
}

func (c *Client) markBad(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bad[addr] = time.Now()
}

// get asks the peer to at addr for file f of checkpoint ck. Its errors
// never carry the request's URL: the signature is not logged.
func (c *Client) get(ctx context.Context, addr string, to target, ck string, f checkpoint.File) (io.ReadCloser, error) {
	r := signed(c.token, c.run, to, ck, f, time.Now())
	tctx, cancel := context.WithCancel(ctx)
	// r and n route the request on a shared listener (node mode); a
	// listener of the node's own ignores r.
	route := url.Values{"r": {c.run}}.Encode()
	req, err := http.NewRequestWithContext(tctx, http.MethodGet, "http://"+addr+filePath+"?"+r.query()+"&"+route, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("request for %s: %w", f.Path, unURL(err))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		c.markBad(addr) // refused or silent: not asked again by this restore
		return nil, unURL(err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%s: %w", resp.Status, fs.ErrNotExist)
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		// Busy: every transfer slot of the peer is taken. It is up (no
		// new session will come): this file from the next peer or the
		// store, the address asked again for the next.
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%s: %w", resp.Status, errBusy)
	case resp.StatusCode == http.StatusServiceUnavailable:
		// A node agent's shared listener that hosts no such run now (its
		// pod is starting again): as down as an address that refuses.
		resp.Body.Close()
		cancel()
		c.markDown(addr)
		return nil, fmt.Errorf("%s: %w", resp.Status, errNotHosted)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusForbidden {
			c.markBad(addr) // another job's agent, or another secret
		}
		return nil, fmt.Errorf("%s", resp.Status)
	case resp.ContentLength != f.Size:
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%d bytes offered, want %d", resp.ContentLength, f.Size)
	}
	// A peer cut off for stalling or dripping is not asked again by this
	// restore: its later files come from other peers or the store; nor is
	// one whose copy failed verification.
	b := newStallBody(resp.Body, cancel, c.stall, c.minRate, c.grace, func() { c.markBad(addr) })
	return &peerBody{stallBody: b, refuse: func(err error) { c.refuse(to.node, addr, err) }}, nil
}

// peerBody is a peer's copy: restore refuses it when it fails
// verification.
type peerBody struct {
	*stallBody
	refuse func(error)
}

var _ checkpoint.Refusable = (*peerBody)(nil)

func (b *peerBody) Refuse(err error) { b.refuse(err) }

// A transfer slower than MinRate on average once Grace has passed is cut
// off (errTooSlow), as one that sends no byte for the stall bound is
// (errStalled): a peer that drips a byte now and then never holds a
// restore longer than Grace + size/MinRate, and its file then comes from
// the store. A healthy peer is far above it: 16 transfers sharing a
// 1 Gbit/s link still get 7 MiB/s each; the store gives a node 100+ MiB/s.
const (
	MinRate = 4 << 20 // bytes per second
	Grace   = 10 * time.Second
)

// unURL is err without the URL an *url.Error names (it holds the signature).
func unURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", strings.ToLower(ue.Op), ue.Err)
	}
	return err
}

// errBusy: a peer had no transfer slot free (maxServing).
var errBusy = errors.New("peer busy")

// errStalled: a peer sent no byte for the stall bound.
var errStalled = errors.New("peer stalled")

// errTooSlow: a peer sent slower than MinRate on average after Grace.
var errTooSlow = errors.New("peer too slow")

// stallBody ends a transfer that makes no progress for stall, or whose
// average rate is below minRate once grace has passed; onCut is then called.
type stallBody struct {
	rc      io.ReadCloser
	cancel  context.CancelFunc
	stall   time.Duration
	minRate int64
	grace   time.Duration
	tick    time.Duration
	start   time.Time
	onCut   func()

	n      atomic.Int64 // bytes read
	last   atomic.Int64 // when the last byte came, unix ns
	closed atomic.Bool
	why    atomic.Pointer[error] // set when cut
	mu     sync.Mutex
	t      *time.Timer
}

func newStallBody(rc io.ReadCloser, cancel context.CancelFunc, stall time.Duration, minRate int64, grace time.Duration, onCut func()) *stallBody {
	b := &stallBody{rc: rc, cancel: cancel, stall: stall, minRate: minRate, grace: grace, start: time.Now(), onCut: onCut}
	b.tick = max(min(stall, grace, time.Second)/4, time.Millisecond)
	b.last.Store(b.start.UnixNano())
	b.mu.Lock()
	b.t = time.AfterFunc(b.tick, b.check)
	b.mu.Unlock()
	return b
}

// check runs every tick until the body is closed or cut.
func (b *stallBody) check() {
	if b.closed.Load() {
		return
	}
	now := time.Now()
	var why error
	switch el := now.Sub(b.start); {
	case now.Sub(time.Unix(0, b.last.Load())) >= b.stall:
		why = fmt.Errorf("no byte for %s: %w", b.stall, errStalled)
	case b.minRate > 0 && el >= b.grace && float64(b.n.Load()) < float64(b.minRate)*el.Seconds():
		why = fmt.Errorf("%d bytes in %s, under %d bytes/s: %w", b.n.Load(), el.Round(time.Millisecond), b.minRate, errTooSlow)
	}
	if why != nil {
		b.why.Store(&why)
		b.cancel()
		if b.onCut != nil {
			b.onCut()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed.Load() {
		b.t.Reset(b.tick)
	}
}

func (b *stallBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.n.Add(int64(n))
		b.last.Store(time.Now().UnixNano())
	}
	if err != nil && err != io.EOF {
		if why := b.why.Load(); why != nil {
			err = *why
		}
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.closed.Store(true)
	b.mu.Lock()
	b.t.Stop()
	b.mu.Unlock()
	b.cancel()
	return b.rc.Close()
}
