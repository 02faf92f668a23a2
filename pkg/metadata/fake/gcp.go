package fake

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GCPOptions configures a fake GCE metadata server. Zero fields take the
// defaults shown.
type GCPOptions struct {
	InstanceID  string // 4520031799277581759
	Name        string // trainer-1
	Zone        string // projects/123456789012/zones/us-central1-a
	MachineType string // projects/123456789012/machineTypes/a2-highgpu-1g
	Preemptible string // TRUE
	ProjectID   string // spot-project
	// MaxWait caps how long a wait_for_change GET hangs (default 5 min, or
	// the request's timeout_sec when shorter); then the unchanged value is
	// returned, as GCE does.
	MaxWait time.Duration
}

// Values of instance/maintenance-event.
const (
	GCPMaintenanceNone      = "NONE"
	GCPMaintenanceMigrate   = "MIGRATE_ON_HOST_MAINTENANCE"
	GCPMaintenanceTerminate = "TERMINATE_ON_HOST_MAINTENANCE"
	GCPMaintenanceShutdown  = "SHUTDOWN_ON_HOST_MAINTENANCE"
)

const gcpPrefix = "/computeMetadata/v1/"

// GCP is a fake GCE metadata server with ETags and hanging GETs.
type GCP struct {
	base
	opts GCPOptions

	mu      sync.Mutex
	values  map[string]*gcpValue // key without gcpPrefix
	version int
}

type gcpValue struct {
	v       string
	etag    string
	changed chan struct{} // closed and replaced on every change
}

var _ Server = (*GCP)(nil)

// NewGCP starts a fake GCE metadata server on a free loopback port. It
// panics if it cannot listen, like httptest.NewServer.
func NewGCP(opts GCPOptions) *GCP {
	g, err := StartGCP("127.0.0.1:0", opts)
	if err != nil {
		panic("fake: " + err.Error())
	}
	return g
}

// StartGCP starts a fake GCE metadata server on addr.
func StartGCP(addr string, opts GCPOptions) (*GCP, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&opts.InstanceID, "4520031799277581759")
	def(&opts.Name, "trainer-1")
	def(&opts.Zone, "projects/123456789012/zones/us-central1-a")
	def(&opts.MachineType, "projects/123456789012/machineTypes/a2-highgpu-1g")
	def(&opts.Preemptible, "TRUE")
	def(&opts.ProjectID, "spot-project")
	if opts.MaxWait <= 0 {
		opts.MaxWait = 5 * time.Minute
	}
	g := &GCP{opts: opts, values: make(map[string]*gcpValue)}
	for k, v := range map[string]string{
		"instance/id":                     opts.InstanceID,
		"instance/name":                   opts.Name,
		"instance/hostname":               opts.Name + ".c." + opts.ProjectID + ".internal",
		"instance/zone":                   opts.Zone,
		"instance/machine-type":           opts.MachineType,
		"instance/scheduling/preemptible": opts.Preemptible,
		"instance/preempted":              "FALSE",
		"instance/maintenance-event":      GCPMaintenanceNone,
		"project/project-id":              opts.ProjectID,
	} {
		g.setLocked(k, v)
	}
	if err := g.start(addr, http.HandlerFunc(g.serve)); err != nil {
		return nil, err
	}
	return g, nil
}

// Host is what GCE_METADATA_HOST takes: host:port, no scheme.
func (g *GCP) Host() string { return g.Addr() }

// Env returns GCE_METADATA_HOST and the fake's host:port.
func (g *GCP) Env() (string, string) { return "GCE_METADATA_HOST", g.Host() }

// Preempt sets instance/preempted to TRUE and returns when it was exposed.
func (g *GCP) Preempt() time.Time { return g.Set("instance/preempted", "TRUE") }

// Maintenance sets instance/maintenance-event (one of the GCPMaintenance
// values) and returns when it was exposed.
func (g *GCP) Maintenance(value string) time.Time {
	return g.Set("instance/maintenance-event", value)
}

// Set sets any metadata key (relative to /computeMetadata/v1/), gives it a
// new ETag, wakes the GETs waiting on it, and returns when it was exposed.
func (g *GCP) Set(key, value string) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setLocked(key, value)
	return g.expose()
}

// Notice preempts the instance.
func (g *GCP) Notice() time.Time { return g.Preempt() }

// NoticeAfter preempts the instance after d.
func (g *GCP) NoticeAfter(d time.Duration) func() bool {
	return time.AfterFunc(d, func() { g.Preempt() }).Stop
}

func (g *GCP) setLocked(key, value string) {
	g.version++
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%d", key, value, g.version)))
	old := g.values[key]
	g.values[key] = &gcpValue{v: value, etag: hex.EncodeToString(sum[:8]), changed: make(chan struct{})}
	if old != nil {
		close(old.changed)
	}
}

func (g *GCP) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	w.Header().Set("Metadata-Flavor", "Google")
	if r.URL.Path == "/" {
		_, _ = w.Write([]byte("computeMetadata/\n"))
		return
	}
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	key := strings.TrimPrefix(r.URL.Path, gcpPrefix)
	q := r.URL.Query()
	g.mu.Lock()
	val, ok := g.values[key]
	g.mu.Unlock()
	if !ok || !strings.HasPrefix(r.URL.Path, gcpPrefix) {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	if q.Get("wait_for_change") == "true" && (q.Get("last_etag") == "" || q.Get("last_etag") == val.etag) {
		val = g.wait(r, key, val)
		if val == nil {
			return
		}
	}
	w.Header().Set("ETag", val.etag)
	w.Header().Set("Content-Type", "application/text")
	_, _ = w.Write([]byte(val.v))
}

// wait blocks until key changes from val or the wait times out, and returns
// the value to answer with; nil when the client left or the server closes.
func (g *GCP) wait(r *http.Request, key string, val *gcpValue) *gcpValue {
	d := g.opts.MaxWait
	if s, err := strconv.Atoi(r.URL.Query().Get("timeout_sec")); err == nil && s > 0 && time.Duration(s)*time.Second < d {
		d = time.Duration(s) * time.Second
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-val.changed:
	case <-t.C:
	case <-r.Context().Done():
		return nil
	case <-g.closing:
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.values[key]
}
