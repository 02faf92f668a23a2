package fake

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Fault is a way for a fake metadata service to misbehave. A fault applies
// to every request until it is cleared with SetFault(FaultNone).
type Fault int

const (
	// FaultNone: answer normally.
	FaultNone Fault = iota
	// Fault5xx: 503 Service Unavailable (GCE answers 503 during maintenance).
	Fault5xx
	// FaultHang: accept the request and never answer, until the client gives
	// up, the fault changes or the server closes (an IMDS token PUT dropped
	// by a hop limit in a container looks like this).
	FaultHang
	// FaultGarbage: 200 with a truncated JSON document.
	FaultGarbage
	// FaultHTML: 200 with an HTML error page, as a captive proxy sends.
	FaultHTML
	// Fault401: 401 Unauthorized on every data request, whatever the token
	// (AWS token PUTs still succeed: a 401 loop).
	Fault401
	// FaultRefused: the connection is reset without an answer, as from a
	// closed port or a crashed proxy.
	FaultRefused
	// FaultStatus: an unexpected status, 418 I'm a teapot.
	FaultStatus
)

var faultNames = map[Fault]string{
	FaultNone: "none", Fault5xx: "5xx", FaultHang: "hang", FaultGarbage: "garbage",
	FaultHTML: "html", Fault401: "401", FaultRefused: "refused", FaultStatus: "status",
}

// Faults lists every fault but FaultNone, for table tests.
var Faults = []Fault{Fault5xx, FaultHang, FaultGarbage, FaultHTML, Fault401, FaultRefused, FaultStatus}

func (f Fault) String() string {
	if s, ok := faultNames[f]; ok {
		return s
	}
	return fmt.Sprintf("fault(%d)", int(f))
}

// ParseFault parses a fault name as printed by String.
func ParseFault(s string) (Fault, error) {
	for f, name := range faultNames {
		if strings.EqualFold(s, name) {
			return f, nil
		}
	}
	return FaultNone, fmt.Errorf("unknown fault %q", s)
}

const (
	garbageBody = `{"DocumentIncarnation": 7, "Events": [{"EventId": "5A3B`
	htmlBody    = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>Bad Gateway</h1><p>The proxy server received an invalid response.</p></body></html>\n"
)

// serveFault answers r according to f and reports whether it did.
// released is closed when the fault changes, closing when the server closes.
func serveFault(w http.ResponseWriter, r *http.Request, f Fault, released, closing <-chan struct{}) bool {
	switch f {
	case Fault5xx:
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
	case FaultHang:
		select {
		case <-r.Context().Done():
		case <-released:
		case <-closing:
		}
		// Answering after a hang would be a fresh reply; drop the
		// connection instead, as a dead middlebox does.
		resetConn(w)
	case FaultGarbage:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(garbageBody))
	case FaultHTML:
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(htmlBody))
	case Fault401:
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	case FaultRefused:
		resetConn(w)
	case FaultStatus:
		http.Error(w, "I'm a teapot", http.StatusTeapot)
	default:
		return false
	}
	return true
}

// resetConn closes the connection under w with a TCP reset.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("fake: response writer cannot hijack")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
