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

func newServer(s *server) *http.Server {
	return &http.Server{Handler: s, ReadHeaderTimeout: s.stall, IdleTimeout: time.Minute, MaxHeaderBytes: 8 << 10,
		ErrorLog: log.New(io.Discard, "", 0)}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != filePath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	req, err := parseRequest(r.URL.Query())
	if err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if !req.authorized(s.token, s.run, time.Now()) {
		s.refuse("no valid signature of this job", r.RemoteAddr, req.file)
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	if req.node != s.node || req.session != s.session {
		// Signed by the job for another node or an earlier session of
		// this one: a URL sent to a stale address, replayed here.
		s.refuse("signed for another node or session", r.RemoteAddr, req.file)
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
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
