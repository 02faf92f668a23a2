package peertier

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"go.uber.org/zap"
)

// DefaultPeerWait bounds how long one restore waits, in all, for peers
// whose records hold the chosen checkpoint but whose addresses refuse the
// connection or do not answer it: in a whole-job restart every node's
// agent starts again at about the same time, and a replacement that asks
// a survivor before the survivor's new agent has published its record
// finds the previous session's address. An agent publishes its record
// within a second or two of its start (the store's secret, one bind, one
// PUT; more when the container image is still being pulled on a busy
// node), so 20 s covers a survivor that starts late with room to spare;
// a peer that is really gone (both machines lost) costs at most that
// long, against the store's download of the same bytes, which for one
// GiB part or more is of the same order.
const DefaultPeerWait = 20 * time.Second

// pollEvery is how often a waiting restore reads the record again: one
// store GET each, per node waited for.
const pollEvery = 300 * time.Millisecond

// peerWait is one wait for node's agent to leave session from: every file
// of the restore that finds that node down shares it.
type peerWait struct {
	done chan struct{}
	rec  *Record // the new session's record, once done; nil: none came
}

// restoreWait is one restore's waiting for peers still starting: one
// bound for all its waits together, and the waits in progress, each
// shared by every file that finds its node down. The Client's mu guards
// it.
type restoreWait struct {
	bound   time.Duration        // all the waits together; 0: none
	session string               // this agent's: a record of it is never waited on
	until   time.Time            // when the waiting ends; zero: none started
	waits   map[string]*peerWait // by node and the session waited out
}

// join is the wait for node's agent to leave old's session (nil: old is
// not waited for), first when it starts now (its caller then polls), and
// when the restore's waiting ends: the bound starts with the first wait.
func (r *restoreWait) join(node string, old *Record, now time.Time) (w *peerWait, first bool, until time.Time) {
	if r.bound <= 0 || (r.session != "" && old.Session == r.session) {
		return nil, false, time.Time{}
	}
	if r.until.IsZero() {
		r.until = now.Add(r.bound)
	}
	key := node + "\x00" + old.Session
	w, ok := r.waits[key]
	if !ok {
		if r.waits == nil {
			r.waits = map[string]*peerWait{}
		}
		w = &peerWait{done: make(chan struct{})}
		r.waits[key] = w
	}
	return w, !ok, r.until
}

// dialNoted wraps a transport's dial so that the addresses it cannot
// reach (refused, timed out, no route) are known to the restore before
// the request's error is returned and the address marked bad: a file that
// then skips that address can tell a peer down from one that refused it.
func (c *Client) dialNoted(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		c.mu.Lock()
		if err != nil {
			c.down[addr] = true
		} else {
			delete(c.down, addr)
		}
		c.mu.Unlock()
		return conn, err
	}
}

// errNotHosted: a node agent's shared listener answered that it hosts no
// such run now (503): the run's pod on that node is starting again.
var errNotHosted = errors.New("run not hosted")

// markDown marks addr bad and down: it answered that the run is not
// hosted there now, as good as unreachable until a new record names it.
func (c *Client) markDown(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bad[addr] = time.Now()
	c.down[addr] = true
}

// isDown: addr could not be reached the last time it was dialled.
func (c *Client) isDown(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.down[addr]
}

// isDialError: err is a failure to connect, not an answer.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// await waits for node's agent to start again: until its record names a
// session other than old's, which it returns (and keeps for the rest of
// the restore, its addresses no longer marked bad), or until the
// restore's wait bound has passed or ctx ends (nil). Concurrent callers
// for the same node and session share one wait; the bound is shared by
// every wait of the restore, not per file nor per node.
func (c *Client) await(ctx context.Context, node string, old *Record) *Record {
	c.mu.Lock()
	w, first, until := c.waiting.join(node, old, time.Now())
	c.mu.Unlock()
	if w == nil {
		return nil
	}
	if first {
		w.rec = c.poll(ctx, node, old, until)
		close(w.done)
	}
	select {
	case <-w.done:
		return w.rec
	case <-ctx.Done():
		return nil
	}
}

// poll reads node's record every pollEvery until its session is not
// old's, until passes or ctx ends; it logs the wait's start and end.
func (c *Client) poll(ctx context.Context, node string, old *Record, until time.Time) *Record {
	start := time.Now()
	if !until.After(start) {
		return nil // the restore's bound is spent: the store
	}
	c.log.Info("peer tier: a peer holding the checkpoint does not answer: waiting for its agent to start",
		zap.String("node", node), zap.String("session", old.Session), zap.Float64("bound_s", until.Sub(start).Seconds()))
	rec, outcome := c.pollRecord(ctx, node, old, until)
	c.log.Info("peer tier: wait for a peer ended", zap.String("node", node),
		zap.Float64("waited_s", time.Since(start).Seconds()), zap.String("outcome", outcome))
	if rec == nil {
		return nil
	}
	c.mu.Lock()
	c.fresh(node, rec)
	c.mu.Unlock()
	return rec
}

// forgive unmarks addr, which failed a request signed for rec's session,
// when the restore has read a newer record of node naming addr since:
// the failure was the previous agent's, not the new one's.
func (c *Client) forgive(node string, rec *Record, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.records[node]; cur != nil && cur.Session != rec.Session && slices.Contains(cur.Addrs, addr) {
		delete(c.bad, addr)
		delete(c.down, addr)
	}
}

// fresh keeps rec, a new session's record, for the rest of the restore,
// its addresses no longer marked bad. c.mu is held.
func (c *Client) fresh(node string, rec *Record) {
	c.records[node] = rec
	for _, a := range rec.Addrs {
		delete(c.bad, a)
		delete(c.down, a)
	}
}

// pollRecord is poll's loop: the new record and "new session", or nil and
// why not ("bound passed", "canceled"). A store read in flight when the
// bound passes ends with it.
func (c *Client) pollRecord(ctx context.Context, node string, old *Record, until time.Time) (*Record, string) {
	dctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-dctx.Done():
			if ctx.Err() != nil {
				return nil, "canceled"
			}
			return nil, "bound passed"
		case <-t.C:
		}
		rec, err := getRecord(dctx, c.st, node)
		switch {
		case err != nil && dctx.Err() == nil:
			c.log.Debug("peer tier: a peer's record unreadable while waiting", zap.String("node", node), zap.Error(err))
		case rec != nil && rec.Session != old.Session:
			return rec, "new session"
		}
	}
}

// reread reads node's record again after one of its addresses refused a
// request signed for old's session: a new agent may have bound the same
// address (a fixed --peer-listen port) after the record was read, and
// refuses requests signed for the previous session (403). It returns the
// new session's record (kept for the rest of the restore, its addresses
// no longer marked bad), or nil when the session is the same: then the
// next node. Once per node and session.
func (c *Client) reread(ctx context.Context, node string, old *Record) *Record {
	key := node + "\x00" + old.Session
	c.mu.Lock()
	r, ok := c.rereads[key]
	c.mu.Unlock()
	if ok {
		return r
	}
	// No lock held over the read, and the read bounded: a store GET that
	// stalls costs this node's copies, not the other files (review 12).
	rec, err := c.readRecord(ctx, node)
	if err != nil || rec == nil || rec.Session == old.Session {
		rec = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.rereads[key]; ok {
		return r // another file's re-read came first
	}
	if ctx.Err() == nil {
		c.rereads[key] = rec
	}
	if rec != nil {
		c.fresh(node, rec)
	}
	return rec
}
