package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// The fleet's objects, under the fleet store (docs/fleet.md, "Where the
// fleet records live"):
//
//	fleet/sessions/CLOUD/TYPE/ZONE/DIR/M.K.N.E.RAND.json  one per session end, written once
//	fleet/summary.gob                                      every run (encoding/gob), written only by compaction
//	fleet/prior/CLOUD/TYPE.json                            per-zone sums, written only by compaction
//
// An agent writes one new session record and nothing else: no object is
// rewritten by two agents. The record's name carries the session's own
// machine seconds M, interruptions K and committed notices N on its
// machine, and E, the journal's entries, so that a prior is one List of
// names; its body is the run as the whole journal gives it (a Run).
const (
	recordsPrefix  = "fleet/sessions/"
	snapshotKey    = "fleet/summary.gob"
	priorPrefix    = "fleet/prior/"
	legacyKey      = "fleet-summary.json" // spotagent.fleet/v1, at the fleet root
	recordFormat   = "spotagent.fleet-record/v1"
	priorFormat    = "spotagent.fleet-prior/v1"
	maxRecord      = 16 << 20
	recordAttempts = 5
)

// maxPriorNames bounds the record names an agent's start lists for its
// prior (two List pages on S3 and GCS), whatever the fleet's size: the
// prior is the last compaction's sums plus at most these sessions since.
const maxPriorNames = 2000

// Tally is machine time and interruptions on one kind of machine: what a
// prior is made of.
type Tally struct {
	Machine       float64 `json:"machine_s"`
	Interruptions int     `json:"interruptions"`
	NoticeCommits int     `json:"notice_commits"`
}

func (t *Tally) add(o Tally) {
	t.Machine += o.Machine
	t.Interruptions += o.Interruptions
	t.NoticeCommits += o.NoticeCommits
}

// keyEl makes s one key element: path-escaped ("/" → %2F), never empty,
// ".", ".." or starting with "." (the file store reserves .spotagent-).
func keyEl(s string) string {
	if s == "" {
		return "_"
	}
	e := url.PathEscape(s)
	if e[0] == '.' {
		e = "%2E" + e[1:]
	}
	if e == "_" {
		e = "%5F"
	}
	return e
}

func unkeyEl(e string) (string, error) {
	if e == "_" {
		return "", nil
	}
	return url.PathUnescape(e)
}

func poolPrefix(k Key) string {
	return recordsPrefix + keyEl(k.Cloud) + "/" + keyEl(k.InstanceType) + "/" + keyEl(k.Zone) + "/"
}

func typePrefix(cloud, typ string) string {
	return recordsPrefix + keyEl(cloud) + "/" + keyEl(typ) + "/"
}

func priorKey(cloud, typ string) string {
	return priorPrefix + keyEl(cloud) + "/" + keyEl(typ) + ".json"
}

// recordName is a session record's key.
func recordName(k Key, dir string, t Tally, entries int) string {
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s%s/%d.%d.%d.%d.%s.json", poolPrefix(k), keyEl(dir),
		int64(t.Machine), t.Interruptions, t.NoticeCommits, entries, hex.EncodeToString(b[:]))
}

// recordKey is what a record's name says.
type recordKey struct {
	Key
	Dir     string
	Tally   Tally
	Entries int
}

// parseRecordName reads a record's key; ok is false for anything else.
func parseRecordName(key string) (r recordKey, ok bool) {
	rest, found := strings.CutPrefix(key, recordsPrefix)
	if !found {
		return r, false
	}
	el := strings.Split(rest, "/")
	if len(el) != 5 || !strings.HasSuffix(el[4], ".json") {
		return r, false
	}
	var err error
	for i, dst := range []*string{&r.Cloud, &r.InstanceType, &r.Zone, &r.Dir} {
		if *dst, err = unkeyEl(el[i]); err != nil {
			return r, false
		}
	}
	f := strings.Split(strings.TrimSuffix(el[4], ".json"), ".")
	if len(f) != 5 {
		return r, false
	}
	var n [4]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil || n[i] < 0 {
			return r, false
		}
	}
	r.Tally = Tally{Machine: float64(n[0]), Interruptions: int(n[1]), NoticeCommits: int(n[2])}
	r.Entries = int(n[3])
	return r, true
}

// record is a session record's body.
type record struct {
	Format string    `json:"format"`
	At     time.Time `json:"at"`
	Run    *Run      `json:"run"`
}

// RecordSession writes one new record of the run, as its journal j stands
// at the end of a session, to the fleet store: dir is the run's directory
// under the fleet (its run id with --store-prefix, "" when the fleet is
// the run's own store), step its newest committed step (0 if none). The
// record is the whole run recomputed from the journal (a retry or another
// agent of the same job never counts a session twice: the fleet keeps the
// record of the fuller journal) and is filed under the machine of the
// session that ended last. It never rewrites an object: every call writes
// a key of its own, so any number of agents may record at once.
func RecordSession(ctx context.Context, fleetStore cloud.Store, dir string, j *journal.Journal, step int64) error {
	return RecordSessionOf(ctx, fleetStore, dir, j, step, "")
}

// RecordSessionOf is RecordSession filed under the session with this id
// (the agents of a job share a journal: each records its own session),
// or the one that ended last when there is none with it.
func RecordSessionOf(ctx context.Context, fleetStore cloud.Store, dir string, j *journal.Journal, step int64, session string) error {
	now := time.Now()
	r, err := runFromJournal(j, dir, step, now)
	if err != nil {
		return fmt.Errorf("fleet record: %w", err)
	}
	if len(r.shares) == 0 {
		return nil // no session to record
	}
	last := r.shares[0]
	for _, sh := range r.shares[1:] {
		if !sh.end.Before(last.end) {
			last = sh
		}
	}
	for _, sh := range r.shares {
		if session != "" && sh.session == session {
			last = sh
		}
	}
	body, err := json.Marshal(record{Format: recordFormat, At: now.UTC(), Run: r})
	if err != nil {
		return err
	}
	key := recordName(r.Cells[last.cell].Key, dir, last.Tally, r.Entries)
	// The key is this call's own: a write that failed, or landed without
	// an answer, is simply written again.
	for attempt := 1; ; attempt++ {
		err = fleetStore.Put(ctx, key, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{})
		if err == nil || attempt >= recordAttempts || ctx.Err() != nil || errors.Is(err, cloud.ErrInvalidKey) {
			break
		}
		if retry.Sleep(ctx, time.Duration(attempt)*50*time.Millisecond) != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("write fleet record: %w", err)
	}
	return nil
}

// poolSums is a prior object: one instance type's per-zone sums over the
// runs of the summary it was computed from.
type poolSums struct {
	Format     string           `json:"format"`
	Generation int64            `json:"generation"` // Summary.Generation
	Zones      map[string]Tally `json:"zones"`
}

// PriorFrom is PriorFor over the fleet store st, reading only what the
// prior of key k needs: its instance type's sums from the last compaction
// (one small object) and the names of at most maxPriorNames session
// records since, under its instance type's prefix. Bounded in requests and
// bytes whatever the fleet's size. A missing fleet gives the flat prior.
func PriorFrom(ctx context.Context, st cloud.Store, k Key, flat, minHours float64) (Prior, error) {
	if k.InstanceType == "" {
		return Prior{Rate: flat, Source: "flag", Key: k}, nil
	}
	var zone, typ Tally
	var err error
	// A compaction writes the sums before it deletes the records it
	// added to them: when the sums changed under the listing, read again.
	for range 3 {
		var v1, v2 string
		zone, typ, v1, err = readPool(ctx, st, k)
		if err != nil {
			break
		}
		n := 0
		err = st.List(ctx, typePrefix(k.Cloud, k.InstanceType), func(o cloud.ObjectInfo) error {
			if n >= maxPriorNames {
				return errEnough
			}
			rk, ok := parseRecordName(o.Key)
			if !ok || rk.Cloud != k.Cloud || rk.InstanceType != k.InstanceType {
				return nil
			}
			n++
			typ.add(rk.Tally)
			if rk.Zone == k.Zone {
				zone.add(rk.Tally)
			}
			return nil
		})
		if errors.Is(err, errEnough) {
			err = nil
		}
		if err != nil {
			break
		}
		if v2, err = poolVersion(ctx, st, k); err != nil || v1 == v2 {
			break
		}
	}
	if err != nil {
		return Prior{Rate: flat, Source: "flag", Key: k}, fmt.Errorf("fleet prior: %w", err)
	}
	return priorOf(zone, typ, k, flat, minHours), nil
}

var errEnough = errors.New("enough")

func poolVersion(ctx context.Context, st cloud.Store, k Key) (string, error) {
	info, err := st.Stat(ctx, priorKey(k.Cloud, k.InstanceType))
	if errors.Is(err, cloud.ErrNotExist) {
		return "", nil
	}
	return info.Version, err
}

// readPool reads k's instance type's sums: its zone's and its type's.
func readPool(ctx context.Context, st cloud.Store, k Key) (zone, typ Tally, version string, err error) {
	if version, err = poolVersion(ctx, st, k); err != nil || version == "" {
		return zone, typ, version, err
	}
	b, err := checkpoint.ReadSmall(ctx, st, priorKey(k.Cloud, k.InstanceType), 1<<20)
	if errors.Is(err, cloud.ErrNotExist) {
		return zone, typ, "", nil
	}
	if err != nil {
		return zone, typ, version, err
	}
	var p poolSums
	if err := json.Unmarshal(b, &p); err != nil {
		return zone, typ, version, fmt.Errorf("parse %s: %w", priorKey(k.Cloud, k.InstanceType), err)
	}
	for z, t := range p.Zones {
		typ.add(t)
		if z == k.Zone {
			zone.add(t)
		}
	}
	return zone, typ, version, nil
}
