package peertier

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// filePath is the server's one path; the query names the file:
// n=<node>&t=<session>&c=<step:012d>-<id>&f=<path>&p=<part>&s=<size>&e=<expiry, unix s>&mac=<hex>.
// n and t are the node asked and its session, from its record: a request
// signed for one node and session is refused by any other (a URL sent to
// a stale or squatted address cannot be replayed at the real node). p is
// the part the file belongs to (a replica of another node's part is kept
// apart from the node's own: localtier).
const filePath = "/spotagent/peer/v1/file"

// macDomain keeps a peer request's MAC apart from the heartbeats', which
// are keyed with the same secret.
const macDomain = "spotagent-peer/v1"

// A request carries an expiry expiryAhead past its signing, by the
// signer's clock. The server accepts it while the signing time it implies
// is within maxSkew of its own clock, either way: the nodes' clocks may
// disagree by up to maxSkew (NTP keeps them within milliseconds), and a
// request captured on the wire can be replayed for at most maxSkew
// (to the node and session it was signed for, for the same file). A
// signature that is valid but outside the window is logged as skew
// ("peer tier: a peer's clock is outside the skew window", skew_s), not
// as a refusal of a forged request.
const (
	expiryAhead = 2 * time.Minute
	maxSkew     = 5 * time.Minute
)

// request names one file of one checkpoint copy.
type request struct {
	node    string // the node asked
	session string // its session, from its record
	ckpt    string // <step:012d>-<id>
	file    string
	part    string // the part file belongs to
	size    int64
	expiry  int64
	mac     string
}

func (r request) sum(token []byte, run string) string {
	h := hmac.New(sha256.New, token)
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%d\x00%d", macDomain, run, r.node, r.session, r.ckpt, r.file, r.part, r.size, r.expiry)
	return hex.EncodeToString(h.Sum(nil))
}

func (r request) query() string {
	return url.Values{"n": {r.node}, "t": {r.session}, "c": {r.ckpt}, "f": {r.file}, "p": {r.part}, "s": {strconv.FormatInt(r.size, 10)},
		"e": {strconv.FormatInt(r.expiry, 10)}, "mac": {r.mac}}.Encode()
}

// target is the node a request is for, and its session (its record's).
type target struct{ node, session string }

// signed is the request to node to for file f of checkpoint ckpt, valid from now on.
func signed(token []byte, run string, to target, ckpt string, f checkpoint.File, now time.Time) request {
	r := request{node: to.node, session: to.session, ckpt: ckpt, file: f.Path, part: f.Part, size: f.Size, expiry: now.Add(expiryAhead).Unix()}
	r.mac = r.sum(token, run)
	return r
}

// parseRequest reads a request from a query, refusing a malformed one.
func parseRequest(q url.Values) (request, error) {
	r := request{node: q.Get("n"), session: q.Get("t"), ckpt: q.Get("c"), file: q.Get("f"), part: q.Get("p"), mac: q.Get("mac")}
	var err error
	if r.size, err = strconv.ParseInt(q.Get("s"), 10, 64); err != nil || r.size < 0 {
		return r, fmt.Errorf("bad size")
	}
	if r.expiry, err = strconv.ParseInt(q.Get("e"), 10, 64); err != nil {
		return r, fmt.Errorf("bad expiry")
	}
	if _, _, err := parseCheckpoint(r.ckpt); err != nil {
		return r, err
	}
	if err := checkpoint.SafeRel(r.file); err != nil {
		return r, err
	}
	if r.part != "" && !checkpoint.ValidID(r.part) {
		return r, fmt.Errorf("bad part")
	}
	return r, nil
}

// verdict is what a request's signature says.
type verdict int

const (
	signedHere verdict = iota // a valid MAC, signed within maxSkew of now
	forged                    // no valid MAC of this job's secret and run
	skewed                    // a valid MAC, signed outside the skew window
)

// check reads r's MAC, then its signing time against now; skew is the
// signer's clock minus ours, as the request's expiry implies it (or the
// age of a replayed request). (Whether r is for this node and session is
// the server's check.)
func (r request) check(token []byte, run string, now time.Time) (v verdict, skew time.Duration) {
	if !hmac.Equal([]byte(r.mac), []byte(r.sum(token, run))) {
		return forged, 0
	}
	skew = time.Unix(r.expiry, 0).Add(-expiryAhead).Sub(now)
	if skew > maxSkew || skew < -maxSkew {
		return skewed, skew
	}
	return signedHere, skew
}

// folder is checkpoint m's store folder name, <step:012d>-<id>.
func folder(m *checkpoint.Manifest) string {
	return path.Base(strings.TrimSuffix(checkpoint.Prefix(m.Step, m.ID), "/"))
}

// parseCheckpoint splits a folder name into its step and id.
func parseCheckpoint(name string) (int64, string, error) {
	s, id, ok := strings.Cut(name, "-")
	step, err := strconv.ParseInt(s, 10, 64)
	if !ok || len(s) != 12 || err != nil || step < 0 || !checkpoint.ValidID(id) {
		return 0, "", fmt.Errorf("bad checkpoint %q", name)
	}
	return step, id, nil
}
