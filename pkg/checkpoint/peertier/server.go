package peertier

import (
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/connlimit"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// maxServing bounds the transfers a node serves at once; more are told
// 503 (and fetch from the store): a node's disk and link are its own
// restore's first.
const maxServing = 16

// copyChunk is the size of one write of a transfer: each gets the stall
// bound as its deadline (so a transfer slower than copyChunk per stall
// bound is cut off: 400 KiB/s at the default).
const copyChunk = 4 << 20

// server answers the peers' requests with files of the local tier.
type server struct {
	token []byte
	run   string
	// node and session: only requests signed for them are served.
	node, session string
	local         checkpoint.Tier // nil: serves nothing
	stall         time.Duration
	log           *zap.Logger
	slots         chan struct{}
	// shared: served on node mode's shared listener, where a request
	// that is not authenticated is answered as one for a run not hosted
	// there (unhosted), so that nothing tells the runs hosted apart
	// before authentication. A listener of its own answers 403.
	shared bool
	warn   *connlimit.Warnings // the skew warnings

	refMu     sync.Mutex
	refLogged time.Time // the last refusal warning; zero: none yet
	refused   int       // refusals since (the warning counts them)
}

// refuseEvery: refused requests log one warning per this interval, with
// their count (a flood of them must not fill the disk with logs).
const refuseEvery = time.Minute

// maxLoggedName bounds the bytes of a refused request's file name logged.
const maxLoggedName = 128

// refuse logs a refused request: the first at once, then at most one
// warning per refuseEvery, counting those it stands for.
func (s *server) refuse(why, remote, file string) {
	s.refMu.Lock()
	defer s.refMu.Unlock()
	s.refused++
	now := time.Now()
	if !s.refLogged.IsZero() && now.Sub(s.refLogged) < refuseEvery {
		return
	}
	if len(file) > maxLoggedName {
		file = file[:maxLoggedName] + "…"
	}
	s.log.Warn("peer tier: requests refused", zap.String("reason", why), zap.String("remote", remote),
		zap.String("file", file), zap.Int("refused", s.refused), zap.Duration("interval", refuseEvery))
	s.refLogged, s.refused = now, 0
}

var discardLog = log.New(io.Discard, "", 0)

func newServer(s *server) *http.Server { return newHTTPServer(s, min(s.stall, readHeaderTimeout)) }

// unhosted answers a request for a run the listener does not host, and
// one a shared listener's run did not authenticate: the same answer.
// 503, not 404, so that the asker waits for the run's new record
// (client.go, wait.go): its pod may be starting again on this node.
func unhosted(w http.ResponseWriter) { refuseConn(w, "unavailable", http.StatusServiceUnavailable) }

// refuseConn answers with an error and closes the connection after it:
// only an authenticated request keeps its connection (keepAlive).
func refuseConn(w http.ResponseWriter, msg string, code int) {
	w.Header().Set("Connection", "close")
	http.Error(w, msg, code)
}

// readRequest reads a request of the peer tier from r, or answers it
// (and closes its connection) when it is none: nothing is held for it.
func readRequest(w http.ResponseWriter, r *http.Request) (request, bool) {
	switch {
	case r.URL.Path != filePath:
		refuseConn(w, "not found", http.StatusNotFound)
		return request{}, false
	case r.Method != http.MethodGet:
		refuseConn(w, "method not allowed", http.StatusMethodNotAllowed)
		return request{}, false
	case r.ContentLength != 0 || len(r.TransferEncoding) > 0:
		refuseConn(w, "a request has no body", http.StatusBadRequest) // never read
		return request{}, false
	}
	req, err := parseRequest(r.URL.Query())
	if err != nil {
		refuseConn(w, "bad request", http.StatusBadRequest)
		return request{}, false
	}
	return req, true
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if req, ok := readRequest(w, r); ok {
		s.serve(w, r, req)
	}
}

// serve authenticates req, then answers it. Before authentication nothing
// is held for it but its connection, which an unauthenticated request
// does not keep.
func (s *server) serve(w http.ResponseWriter, r *http.Request, req request) {
	switch v, skew := req.check(s.token, s.run, time.Now()); v {
	case skewed:
		// A signature of the job's secret: the signer's clock is off by
		// more than the window (or the request is older than it: a
		// replay looks the same). Refused, and said as such.
		s.warn.Note("peer tier: a peer's clock is outside the skew window: its requests are refused", zap.String("remote", r.RemoteAddr),
			zap.Float64("skew_s", skew.Seconds()), zap.Float64("window_s", maxSkew.Seconds()))
		s.refuseAuth(w)
		return
	case forged:
		s.refuse("no valid signature of this job", r.RemoteAddr, req.file)
		s.refuseAuth(w)
		return
	}
	if req.node != s.node || req.session != s.session {
		// Signed by the job for another node or an earlier session of
		// this one: a URL sent to a stale address, replayed here.
		s.refuse("signed for another node or session", r.RemoteAddr, req.file)
		refuseConn(w, "forbidden", http.StatusForbidden)
		return
	}
	keepAlive(w, r, routeKey(s.run, s.node)) // limits.go
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		// Retry-After tells busy from a run not hosted (unhosted): the
		// asker takes the file from the next peer or the store at once.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	if s.local == nil {
		http.NotFound(w, r)
		return
	}
	step, id, _ := parseCheckpoint(req.ckpt) // checked by parseRequest
	rc, err := s.local.Open(r.Context(), &checkpoint.Manifest{Step: step, ID: id}, checkpoint.File{Path: req.file, Size: req.size, Part: req.part})
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("peer tier: local copy not served", zap.String("checkpoint", req.ckpt), zap.String("file", req.file), zap.Error(err))
		}
		http.NotFound(w, r)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(req.size, 10))
	w.WriteHeader(http.StatusOK)
	n, err := sendBounded(w, rc, req.size, s.stall)
	if err != nil || n != req.size {
		// The client sees a short body: its restore takes the file from the store.
		s.log.Warn("peer tier: transfer cut short", zap.String("file", req.file), zap.Int64("bytes", n), zap.Int64("size_bytes", req.size), zap.Error(err))
		return
	}
	s.log.Debug("peer tier: file served", zap.String("checkpoint", req.ckpt), zap.String("file", req.file), zap.Int64("bytes", n), zap.String("remote", r.RemoteAddr))
}

// refuseAuth answers a request that is not authenticated: 403 on a
// listener of the node's own, on a shared one as a run not hosted.
func (s *server) refuseAuth(w http.ResponseWriter) {
	if s.shared {
		unhosted(w)
		return
	}
	refuseConn(w, "forbidden", http.StatusForbidden)
}

// sendBounded sends size bytes of r to w in chunks of copyChunk, each
// with the stall bound as its write deadline: a peer that stops reading is
// cut off. From a file, each chunk goes by sendfile(2) (http's ReadFrom):
// a user-space copy cost a third of loopback's rate on 2 cores (make bench).
func sendBounded(w http.ResponseWriter, r io.Reader, size int64, stall time.Duration) (int64, error) {
	rc := http.NewResponseController(w)
	var sent int64
	for sent < size {
		rc.SetWriteDeadline(time.Now().Add(stall))
		n, err := io.CopyN(w, r, min(copyChunk, size-sent))
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}
