package fake

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// awsTimeLayout is how IMDS writes times in events/maintenance/scheduled.
const awsTimeLayout = "2 Jan 2006 15:04:05 GMT"

// AWSOptions configures a fake IMDS. Zero fields take the defaults shown.
type AWSOptions struct {
	InstanceID   string // i-0123456789abcdef0
	InstanceType string // g5.xlarge
	Zone         string // us-east-1a
	Lifecycle    string // spot
	// TokenTTL caps the lifetime of the tokens handed out, whatever the
	// client asks (0: as asked, at most 6 h). The granted TTL is reported
	// in the response header, as IMDS does.
	TokenTTL time.Duration
}

// AWSEvent is one entry of events/maintenance/scheduled.
type AWSEvent struct {
	EventID     string // instance-event-0d59937288b749b32
	Code        string // system-reboot, instance-stop, instance-retirement, ...
	Description string
	State       string // active, completed, canceled
	NotBefore   time.Time
	NotAfter    time.Time
	// NotBeforeRaw, when set, is written instead of NotBefore (a time
	// IMDS might write in a form nobody expects).
	NotBeforeRaw string
}

// AWS is a fake EC2 instance metadata service enforcing IMDSv2.
type AWS struct {
	base
	opts AWSOptions

	mu         sync.Mutex
	tokens     map[string]time.Time // token -> expiry
	tokenPUTs  int
	action     []byte // spot/instance-action body, nil = 404
	rebalance  []byte // events/recommendations/rebalance body, nil = 404
	events     []AWSEvent
	lifecycle  string         // autoscaling/target-lifecycle-state, "" = 404
	tokenFault Fault          // applies to token PUTs only
	reads      map[string]int // meta-data path -> GETs answered
}

var _ Server = (*AWS)(nil)

// NewAWS starts a fake IMDS on a free loopback port. It panics if it
// cannot listen, like httptest.NewServer.
func NewAWS(opts AWSOptions) *AWS {
	a, err := StartAWS("127.0.0.1:0", opts)
	if err != nil {
		panic("fake: " + err.Error())
	}
	return a
}

// StartAWS starts a fake IMDS on addr.
func StartAWS(addr string, opts AWSOptions) (*AWS, error) {
	if opts.InstanceID == "" {
		opts.InstanceID = "i-0123456789abcdef0"
	}
	if opts.InstanceType == "" {
		opts.InstanceType = "g5.xlarge"
	}
	if opts.Zone == "" {
		opts.Zone = "us-east-1a"
	}
	if opts.Lifecycle == "" {
		opts.Lifecycle = "spot"
	}
	a := &AWS{opts: opts, tokens: make(map[string]time.Time)}
	a.exempt = func(r *http.Request, f Fault) bool { return f == Fault401 && r.URL.Path == awsTokenPath }
	if err := a.start(addr, http.HandlerFunc(a.serve)); err != nil {
		return nil, err
	}
	return a, nil
}

// Env returns AWS_EC2_METADATA_SERVICE_ENDPOINT and the fake's URL.
func (a *AWS) Env() (string, string) { return "AWS_EC2_METADATA_SERVICE_ENDPOINT", a.URL() }

// Terminate exposes spot/instance-action {"action": action, "time": at}
// (action is terminate, stop or hibernate) and returns when it did.
func (a *AWS) Terminate(action string, at time.Time) time.Time {
	body, _ := json.Marshal(map[string]string{"action": action, "time": at.UTC().Format(time.RFC3339)})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.action = body
	return a.expose()
}

// TerminateRaw exposes spot/instance-action with the time written as given
// (for an answer whose time does not parse) and returns when it did.
func (a *AWS) TerminateRaw(action, at string) time.Time {
	body, _ := json.Marshal(map[string]string{"action": action, "time": at})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.action = body
	return a.expose()
}

// ClearTermination makes spot/instance-action answer 404 again.
func (a *AWS) ClearTermination() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.action = nil
}

// Rebalance exposes a rebalance recommendation with the given noticeTime
// and returns when it did.
func (a *AWS) Rebalance(noticeTime time.Time) time.Time {
	body, _ := json.Marshal(map[string]string{"noticeTime": noticeTime.UTC().Format(time.RFC3339)})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rebalance = body
	return a.expose()
}

// Maintenance adds ev to the scheduled events, or replaces the event with
// the same EventID, and returns when it was exposed. An empty State is
// "active".
func (a *AWS) Maintenance(ev AWSEvent) time.Time {
	if ev.State == "" {
		ev.State = "active"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.events {
		if a.events[i].EventID == ev.EventID {
			a.events[i] = ev
			return a.expose()
		}
	}
	a.events = append(a.events, ev)
	return a.expose()
}

// CancelMaintenance sets the State of event id to "canceled" and returns
// when it was exposed (zero if there is no such event).
func (a *AWS) CancelMaintenance(id string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.events {
		if a.events[i].EventID == id {
			a.events[i].State = "canceled"
			return a.expose()
		}
	}
	return time.Time{}
}

// SetLifecycleState sets autoscaling/target-lifecycle-state (InService,
// Terminated, Warmed:Stopped, ...) and returns when it was exposed.
func (a *AWS) SetLifecycleState(state string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lifecycle = state
	return a.expose()
}

// Notice exposes a spot termination two minutes ahead.
func (a *AWS) Notice() time.Time {
	return a.Terminate("terminate", time.Now().Add(2*time.Minute).Truncate(time.Second))
}

// NoticeAfter calls Notice after d.
func (a *AWS) NoticeAfter(d time.Duration) func() bool {
	return time.AfterFunc(d, func() { a.Notice() }).Stop
}

// RevokeTokens invalidates every token handed out: the next request with
// one gets 401, as after a token expired on the server's side.
func (a *AWS) RevokeTokens() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.tokens)
}

// SetTokenFault makes only the token PUTs fail in the way f says, e.g.
// FaultHang for a container whose answers are dropped by the IMDS hop
// limit; data GETs still answer (with 401, lacking a valid token).
func (a *AWS) SetTokenFault(f Fault) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokenFault = f
}

// Reads counts the GETs of one meta-data path (e.g. "spot/instance-action")
// that carried a valid token.
func (a *AWS) Reads(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reads[path]
}

// TokenRequests counts the successful token PUTs.
func (a *AWS) TokenRequests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokenPUTs
}

const (
	awsTokenPath   = "/latest/api/token"
	awsMetaPrefix  = "/latest/meta-data/"
	awsTTLHeader   = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
	awsTokenHeader = "X-Aws-Ec2-Metadata-Token"
)

func (a *AWS) serve(w http.ResponseWriter, r *http.Request) {
	// IMDS refuses anything that went through a proxy.
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	if r.URL.Path == awsTokenPath {
		a.serveToken(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if !a.validToken(r.Header.Get(awsTokenHeader)) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, awsMetaPrefix)
	a.mu.Lock()
	if a.reads == nil {
		a.reads = map[string]int{}
	}
	a.reads[path]++
	a.mu.Unlock()
	body, typ, ok := a.lookup(path)
	if !ok || !strings.HasPrefix(r.URL.Path, awsMetaPrefix) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(awsNotFound))
		return
	}
	w.Header().Set("Content-Type", typ)
	_, _ = w.Write(body)
}

const awsNotFound = `<?xml version="1.0" encoding="iso-8859-1"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
	"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title>404 - Not Found</title>
 </head>
 <body>
  <h1>404 - Not Found</h1>
 </body>
</html>
`

func (a *AWS) serveToken(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	f := a.tokenFault
	a.mu.Unlock()
	if serveFault(w, r, f, a.closing, a.closing) {
		return
	}
	if r.Method != http.MethodPut {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	secs, err := strconv.Atoi(r.Header.Get(awsTTLHeader))
	if err != nil || secs < 1 || secs > 21600 {
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	ttl := time.Duration(secs) * time.Second
	if a.opts.TokenTTL > 0 && a.opts.TokenTTL < ttl {
		ttl = a.opts.TokenTTL
	}
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	tok := "AQAEA" + hex.EncodeToString(raw[:])
	a.mu.Lock()
	a.tokens[tok] = time.Now().Add(ttl)
	a.tokenPUTs++
	a.mu.Unlock()
	w.Header().Set(awsTTLHeader, strconv.Itoa(max(1, int(ttl/time.Second))))
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(tok))
}

func (a *AWS) validToken(tok string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.tokens[tok]
	return ok && time.Now().Before(exp)
}

// lookup returns the body and content type of a meta-data path.
func (a *AWS) lookup(path string) ([]byte, string, bool) {
	const text = "text/plain"
	a.mu.Lock()
	defer a.mu.Unlock()
	switch path {
	case "instance-id":
		return []byte(a.opts.InstanceID), text, true
	case "instance-type":
		return []byte(a.opts.InstanceType), text, true
	case "placement/availability-zone":
		return []byte(a.opts.Zone), text, true
	case "instance-life-cycle":
		return []byte(a.opts.Lifecycle), text, true
	case "spot/instance-action":
		return a.action, text, a.action != nil
	case "events/recommendations/rebalance":
		return a.rebalance, text, a.rebalance != nil
	case "events/maintenance/scheduled":
		return awsEventsJSON(a.events), text, true
	case "autoscaling/target-lifecycle-state":
		return []byte(a.lifecycle), text, a.lifecycle != ""
	}
	return nil, "", false
}

func awsEventsJSON(evs []AWSEvent) []byte {
	type wire struct {
		NotBefore   string `json:"NotBefore"`
		Code        string `json:"Code"`
		Description string `json:"Description"`
		EventID     string `json:"EventId"`
		NotAfter    string `json:"NotAfter,omitempty"`
		State       string `json:"State"`
	}
	out := make([]wire, 0, len(evs))
	for _, e := range evs {
		w := wire{Code: e.Code, Description: e.Description, EventID: e.EventID, State: e.State,
			NotBefore: e.NotBefore.UTC().Format(awsTimeLayout)}
		if e.NotBeforeRaw != "" {
			w.NotBefore = e.NotBeforeRaw
		}
		if !e.NotAfter.IsZero() {
			w.NotAfter = e.NotAfter.UTC().Format(awsTimeLayout)
		}
		out = append(out, w)
	}
	body, _ := json.MarshalIndent(out, "", "  ")
	return body
}
