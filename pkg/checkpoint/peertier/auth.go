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
// c=<step:012d>-<id>&f=<path>&s=<size>&e=<expiry, unix s>&mac=<hex>.
const filePath = "/spotagent/peer/v1/file"

// macDomain keeps a peer request's MAC apart from the heartbeats', which
// are keyed with the same secret.
const macDomain = "spotagent-peer/v1"

// A request is valid until its expiry; one further ahead than maxAhead is
// refused (clock skew between the nodes is allowed for by expiryAhead).
const (
	expiryAhead = 2 * time.Minute
	maxAhead    = 10 * time.Minute
)

// request names one file of one checkpoint copy.
type request struct {
	ckpt   string // <step:012d>-<id>
	file   string
	size   int64
	expiry int64
	mac    string
}

func (r request) sum(token []byte, run string) string {
	h := hmac.New(sha256.New, token)
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%d\x00%d", macDomain, run, r.ckpt, r.file, r.size, r.expiry)
	return hex.EncodeToString(h.Sum(nil))
}

func (r request) query() string {
	return url.Values{"c": {r.ckpt}, "f": {r.file}, "s": {strconv.FormatInt(r.size, 10)},
		"e": {strconv.FormatInt(r.expiry, 10)}, "mac": {r.mac}}.Encode()
}

// signed is the request for file f of checkpoint ckpt, valid from now on.
func signed(token []byte, run, ckpt string, f checkpoint.File, now time.Time) request {
	r := request{ckpt: ckpt, file: f.Path, size: f.Size, expiry: now.Add(expiryAhead).Unix()}
	r.mac = r.sum(token, run)
	return r
}

// parseRequest reads a request from a query, refusing a malformed one.
func parseRequest(q url.Values) (request, error) {
	r := request{ckpt: q.Get("c"), file: q.Get("f"), mac: q.Get("mac")}
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
	return r, nil
}

// authorized reports whether r carries a valid MAC and has not expired.
func (r request) authorized(token []byte, run string, now time.Time) bool {
	if r.expiry < now.Unix() || r.expiry > now.Add(maxAhead).Unix() {
		return false
	}
	return hmac.Equal([]byte(r.mac), []byte(r.sum(token, run)))
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
