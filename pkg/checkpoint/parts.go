package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// A job checkpoint is made of parts, one per node (one agent each):
//
//	checkpoints/<step:012d>-<id>/<node>/<path...>    data objects of one part
//	checkpoints/<step:012d>-<id>/parts/<node>.json   part manifest, if-absent, after its data
//	checkpoints/<step:012d>-<id>/manifest.json       job manifest, if-absent, once every part is durable
//	latest.json                                      compare-and-swap, after the manifest
//
// Every agent of the job commits its own part and then waits for the
// others; whichever sees the parts complete first writes manifest.json
// (if-absent: one writer wins, the others read and accept it). docs/storage.md
// has the argument.

// partFormat names the part manifest schema.
const partFormat = "spotagent.part/v1"

// partsDir holds the part manifests of a job checkpoint.
const partsDir = "parts/"

// ErrIncomplete means a job checkpoint's parts did not all arrive before
// the commit's context ended: no manifest, nothing restorable.
var ErrIncomplete = errors.New("checkpoint incomplete")

// ErrPartsDisagree means the parts of a job checkpoint cannot make one
// checkpoint (a rank claimed twice, different world sizes or runs, a
// broken part manifest): it is never committed.
var ErrPartsDisagree = errors.New("checkpoint parts disagree")

// PartSpec names this node's part of a job checkpoint.
type PartSpec struct {
	Node      string // part name, "node-<k>"; a valid id other than "parts"
	Ranks     []int  // the job ranks whose files this part holds
	WorldSize int    // ranks in the whole job
}

// PartInfo is a part as the job manifest lists it.
type PartInfo struct {
	Node  string `json:"node"`
	Ranks []int  `json:"ranks"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
}

// PartManifest is the content of parts/<node>.json: one node's files of a
// job checkpoint. It is written only after every object it lists is durable.
type PartManifest struct {
	Format    string          `json:"format"`
	RunID     string          `json:"run_id"`
	ID        string          `json:"id"`
	Step      int64           `json:"step"`
	Reason    string          `json:"reason"`
	Node      string          `json:"node"`
	Ranks     []int           `json:"ranks"`
	WorldSize int             `json:"world_size"`
	Created   time.Time       `json:"created"`
	Source    Machine         `json:"source"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	Files     []File          `json:"files"`
}

// PartPrefix is the store prefix of one part's data objects, ending in "/".
func PartPrefix(step int64, id, node string) string { return Prefix(step, id) + node + "/" }

// partKey is the key of one part's manifest.
func partKey(step int64, id, node string) string {
	return Prefix(step, id) + partsDir + node + ".json"
}

// validNode accepts a part name that cannot clash with the other names in
// a checkpoint's prefix.
func validNode(node string) bool {
	return ValidID(node) && node != strings.TrimSuffix(partsDir, "/") && node != manifestObj
}

// Validate checks a PartSpec before anything is uploaded.
func (p *PartSpec) Validate() error {
	if !validNode(p.Node) {
		return fmt.Errorf("bad part name %q", p.Node)
	}
	return checkRanks(p.Ranks, p.WorldSize)
}

func checkRanks(ranks []int, world int) error {
	if world < 1 {
		return fmt.Errorf("world size %d", world)
	}
	if len(ranks) == 0 {
		return errors.New("no ranks")
	}
	seen := map[int]bool{}
	for _, r := range ranks {
		if r < 0 || r >= world {
			return fmt.Errorf("rank %d outside world size %d", r, world)
		}
		if seen[r] {
			return fmt.Errorf("rank %d twice", r)
		}
		seen[r] = true
	}
	return nil
}

// Validate checks a part manifest as Validate checks a manifest.
func (p *PartManifest) Validate() error {
	if p.Format != partFormat {
		return fmt.Errorf("unknown part format %q", p.Format)
	}
	if !ValidID(p.ID) {
		return fmt.Errorf("bad checkpoint id %q", p.ID)
	}
	if p.Step < 0 {
		return fmt.Errorf("negative step %d", p.Step)
	}
	if !validNode(p.Node) {
		return fmt.Errorf("bad part name %q", p.Node)
	}
	if err := checkRanks(p.Ranks, p.WorldSize); err != nil {
		return fmt.Errorf("part %s: %w", p.Node, err)
	}
	if len(p.Files) == 0 {
		return fmt.Errorf("part %s: no files", p.Node)
	}
	for _, f := range p.Files {
		if f.Part != p.Node {
			return fmt.Errorf("part %s: file %q names part %q", p.Node, f.Path, f.Part)
		}
	}
	return validateFiles(p.Files)
}

// validateParts checks a job manifest's parts: every file belongs to a
// listed part, each part's counts match its files, and the parts' ranks
// cover 0..n-1 exactly once. A single-node manifest has no parts and no
// file names one.
func (m *Manifest) validateParts() error {
	if len(m.Parts) == 0 {
		for _, f := range m.Files {
			if f.Part != "" {
				return fmt.Errorf("file %q names part %q, the manifest lists no parts", f.Path, f.Part)
			}
		}
		return nil
	}
	type count struct {
		files int
		bytes int64
	}
	got := map[string]*count{}
	var ranks []int
	for _, p := range m.Parts {
		if !validNode(p.Node) || got[p.Node] != nil {
			return fmt.Errorf("bad or duplicate part %q", p.Node)
		}
		got[p.Node] = &count{}
		ranks = append(ranks, p.Ranks...)
	}
	slices.Sort(ranks)
	for i, r := range ranks {
		if r != i {
			return fmt.Errorf("part ranks %v do not cover 0..%d once", ranks, len(ranks)-1)
		}
	}
	for _, f := range m.Files {
		c := got[f.Part]
		if c == nil {
			return fmt.Errorf("file %q names unknown part %q", f.Path, f.Part)
		}
		c.files++
		c.bytes += f.Size
	}
	for _, p := range m.Parts {
		if c := got[p.Node]; c.files != p.Files || c.bytes != p.Bytes {
			return fmt.Errorf("part %s: lists %d files, %d bytes; the manifest holds %d, %d", p.Node, p.Files, p.Bytes, c.files, c.bytes)
		}
	}
	return nil
}

// Part returns the part named node, or nil.
func (m *Manifest) Part(node string) *PartInfo {
	for i := range m.Parts {
		if m.Parts[i].Node == node {
			return &m.Parts[i]
		}
	}
	return nil
}

// PartBytes is the size of the files of part node.
func (m *Manifest) PartBytes(node string) int64 {
	var n int64
	for _, f := range m.Files {
		if f.Part == node {
			n += f.Size
		}
	}
	return n
}

// NewPartPipeline is NewPipeline for this node's part of a job checkpoint:
// early uploads go under the part's prefix, where Commit with req.Part
// expects them.
func (c *Committer) NewPartPipeline(ctx context.Context, root *os.Root, step int64, id, node string) *Pipeline {
	p := c.NewPipeline(ctx, root, step, id)
	p.prefix = c.partPrefix(max(step, 0), id, node) // nothing was added yet: no upload uses it
	return p
}

// partPrefix is where this committer puts its part's data objects: under
// the part, in its session's folder when it has one.
func (c *Committer) partPrefix(step int64, id, node string) string {
	p := PartPrefix(step, id, node)
	if c.Session != "" {
		p += c.Session + "/"
	}
	return p
}

// pipelineFits reports whether pl uploads under the part node of checkpoint
// id (at any step: a done may report another step than expected).
func pipelineFits(pl *Pipeline, id string, part *PartSpec) bool {
	if part == nil {
		return true
	}
	_, rest, ok := strings.Cut(pl.prefix, "-"+id+"/")
	return ok && rest == strings.TrimPrefix(pl.c.partPrefix(0, id, part.Node), Prefix(0, id))
}

// commitPart writes this node's part manifest (its data is durable), waits
// for the other parts and commits the job manifest once they cover every
// rank. unslot frees the commit's upload slot: waiting for other nodes
// must not hold it.
func (c *Committer) commitPart(ctx context.Context, log *zap.Logger, req Request, m *Manifest, unslot func()) (*Manifest, error) {
	for i := range m.Files {
		m.Files[i].Part = req.Part.Node
	}
	own := &PartManifest{
		Format: partFormat, RunID: c.RunID, ID: req.ID, Step: req.Step, Reason: req.Reason,
		Node: req.Part.Node, Ranks: slices.Sorted(slices.Values(req.Part.Ranks)), WorldSize: req.Part.WorldSize,
		Created: m.Created, Source: m.Source, Metadata: m.Metadata, Files: m.Files,
	}
	body, err := json.MarshalIndent(own, "", "  ")
	if err != nil {
		return nil, err
	}
	key := partKey(req.Step, req.ID, req.Part.Node)
	if c.PartLease != nil {
		// A newer copy of this node exists: its parts are the node's.
		if err := c.PartLease.Check(ctx); err != nil {
			return nil, fmt.Errorf("write part: %w", err)
		}
	}
	if err := putOnce(ctx, c.Store, key, body); err != nil {
		if errors.Is(err, cloud.ErrPrecondition) {
			return nil, fmt.Errorf("write part: %s exists, written by another agent: %w", key, ErrPartsDisagree)
		}
		if req.Pipeline != nil && !c.partAbsent(key) {
			// The write may have landed (a deadline that ended after the
			// store took it): then the part names the early uploads, and
			// deleting them would break a durable part. Keep them;
			// retention removes them if no manifest ever lists them.
			req.Pipeline.committed(m)
		}
		return nil, fmt.Errorf("write part: %w", err)
	}
	if req.Pipeline != nil { // the part lists its early uploads: never delete them
		req.Pipeline.committed(m)
	}
	unslot()
	log.Info("part written, waiting for the other parts", zap.String("part", req.Part.Node), zap.Ints("ranks", own.Ranks))
	job, err := c.awaitParts(ctx, log, own)
	if err != nil {
		return nil, err
	}
	mkey := ManifestKey(req.Step, req.ID)
	body, err = marshalManifest(job)
	if err != nil {
		return nil, err
	}
	err = c.Store.Put(ctx, mkey, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{IfAbsent: true})
	if errors.Is(err, cloud.ErrPrecondition) {
		// Another node finished first (or a retried write of ours landed):
		// its manifest stands if it names this checkpoint and this part.
		won, rerr := ReadManifest(ctx, c.Store, mkey)
		if rerr != nil {
			return nil, fmt.Errorf("read the manifest another agent wrote: %w", rerr)
		}
		if err := sameCheckpoint(won, own); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", mkey, err)
		}
		log.Info("another agent wrote the job manifest", zap.String("manifest", mkey))
		return won, nil
	}
	if err != nil {
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	return job, nil
}

// partAbsent reports whether the part manifest key is known not to exist,
// asked with a short context of its own (the commit's may have ended):
// false when it exists or the store cannot say.
func (c *Committer) partAbsent(key string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Store.Stat(ctx, key)
	return errors.Is(err, cloud.ErrNotExist)
}

// sameCheckpoint checks that m is the job manifest own belongs to: same
// id and step, and own's files in it as own lists them.
func sameCheckpoint(m *Manifest, own *PartManifest) error {
	if m.ID != own.ID || m.Step != own.Step {
		return fmt.Errorf("names %d-%s, not %d-%s: %w", m.Step, m.ID, own.Step, own.ID, ErrPartsDisagree)
	}
	if m.Part(own.Node) == nil {
		return fmt.Errorf("lacks part %s: %w", own.Node, ErrPartsDisagree)
	}
	have := map[string]File{}
	for _, f := range m.Files {
		if f.Part == own.Node {
			have[f.Path] = f
		}
	}
	for _, f := range own.Files {
		if have[f.Path] != f {
			return fmt.Errorf("lists part %s's file %q otherwise: %w", own.Node, f.Path, ErrPartsDisagree)
		}
	}
	return nil
}

// partsSleep is awaitParts' back-off between listings; the simulation
// (sim_test.go) makes it a step of its schedule instead of a real wait.
var partsSleep = retry.Sleep

// awaitParts polls the checkpoint's parts/ listing (100 ms, doubling to
// 1 s) until the parts cover every rank of own's world exactly once, and
// returns the job manifest they make. ctx ending first: ErrIncomplete.
//
// From partsWarnAfter on it says so (a warning naming the missing ranks and
// the time left, then one a minute), and gives up at once when no other
// node's agent ever took part in the run (checkOtherNodes).
func (c *Committer) awaitParts(ctx context.Context, log *zap.Logger, own *PartManifest) (*Manifest, error) {
	cache := map[string]*PartManifest{partKey(own.Step, own.ID, own.Node): own}
	_, missing, _ := joinParts(own, []*PartManifest{own}) // until the first listing
	start, warnAt := time.Now(), partsWarnAfter
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if waited := time.Since(start); waited >= warnAt && ctx.Err() == nil {
			warnAt = waited + time.Minute
			if err := c.checkOtherNodes(ctx, log, own, missing, waited); err != nil {
				return nil, err
			}
		}
		parts, err := readParts(ctx, c.Store, own.Step, own.ID, cache)
		switch {
		case err == nil:
			m, miss, err := joinParts(own, parts)
			if err != nil || m != nil {
				return m, err
			}
			missing = miss
		case errors.Is(err, ErrPartsDisagree):
			return nil, err
		case ctx.Err() == nil:
			log.Warn("could not read the other parts, retrying", zap.Error(err))
		}
		if partsSleep(ctx, wait) != nil {
			return nil, fmt.Errorf("%w: ranks %v of %d never committed their part (%w)", ErrIncomplete, missing, own.WorldSize, context.Cause(ctx))
		}
	}
}

// partsWarnAfter is how long awaitParts waits for the other parts before
// it says so: other nodes' parts come within a second or two of this one
// when their ranks save together.
var partsWarnAfter = 10 * time.Second

// checkOtherNodes warns that the job checkpoint is still waiting for the
// ranks missing, and fails it (ErrIncomplete) when no other node's agent
// ever took a part lease of this run: nobody will write their part (a node
// runs its trainer without spotagent, or without --node-rank).
func (c *Committer) checkOtherNodes(ctx context.Context, log *zap.Logger, own *PartManifest, missing []int, waited time.Duration) error {
	others := map[string]bool{}
	err := c.Store.List(ctx, leaseDir, func(o cloud.ObjectInfo) error {
		if node, _, ok := strings.Cut(strings.TrimPrefix(o.Key, leaseDir), "/"); ok && node != own.Node {
			others[node] = true
		}
		return nil
	})
	fields := []zap.Field{zap.String("id", own.ID), zap.Int64("step", own.Step), zap.Ints("missing_ranks", missing),
		zap.Int("world_size", own.WorldSize), zap.Strings("other_nodes_leased", slices.Sorted(maps.Keys(others))), zap.Float64("waited_s", waited.Seconds())}
	if dl, ok := ctx.Deadline(); ok {
		fields = append(fields, zap.Float64("left_s", time.Until(dl).Seconds()))
	}
	log.Warn("job checkpoint still waiting for the other nodes' parts", fields...)
	if err == nil && len(others) == 0 {
		return fmt.Errorf("%w: ranks %v of %d: no other node's agent ever took part in this run (no part lease besides %s's): run spotagent with --node-rank on every node",
			ErrIncomplete, missing, own.WorldSize, own.Node)
	}
	return nil
}

// readParts lists parts/ of checkpoint (step, id) and reads the part
// manifests not in cache (they are written once: a read is final).
func readParts(ctx context.Context, st cloud.Store, step int64, id string, cache map[string]*PartManifest) ([]*PartManifest, error) {
	dir := Prefix(step, id) + partsDir
	var keys []string
	err := st.List(ctx, dir, func(o cloud.ObjectInfo) error {
		if rest := strings.TrimPrefix(o.Key, dir); strings.HasSuffix(rest, ".json") && !strings.Contains(rest, "/") {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list parts: %w", err)
	}
	var parts []*PartManifest
	for _, k := range keys {
		p := cache[k]
		if p == nil {
			p, err = readPart(ctx, st, k)
			if errors.Is(err, cloud.ErrNotExist) {
				continue // deleted since the listing (retention)
			}
			if err != nil {
				return nil, err
			}
			cache[k] = p
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// readPart reads and validates a part manifest. One that does not parse,
// validate or belong at its key is ErrPartsDisagree.
func readPart(ctx context.Context, st cloud.Store, key string) (*PartManifest, error) {
	var p PartManifest
	if err := readJSON(ctx, st, key, maxManifest, &p); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syn) || errors.As(err, &typ) {
			return nil, fmt.Errorf("%w: %w", ErrPartsDisagree, err)
		}
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("part %s: %w: %w", key, ErrPartsDisagree, err)
	}
	if want := partKey(p.Step, p.ID, p.Node); want != key {
		return nil, fmt.Errorf("part %s: names step %d id %s node %s, which belong at %s: %w", key, p.Step, p.ID, p.Node, want, ErrPartsDisagree)
	}
	return &p, nil
}

// joinParts returns the job manifest the parts make once their ranks cover
// own's world exactly once, or the ranks still missing. Parts that cannot
// make one checkpoint are ErrPartsDisagree.
func joinParts(own *PartManifest, parts []*PartManifest) (*Manifest, []int, error) {
	holder := make([]*PartManifest, own.WorldSize)
	for _, p := range parts {
		if p.WorldSize != own.WorldSize || p.RunID != own.RunID {
			return nil, nil, fmt.Errorf("%w: part %s has run %q world size %d, part %s run %q world size %d",
				ErrPartsDisagree, p.Node, p.RunID, p.WorldSize, own.Node, own.RunID, own.WorldSize)
		}
		for _, r := range p.Ranks {
			if h := holder[r]; h != nil {
				return nil, nil, fmt.Errorf("%w: rank %d claimed by parts %s and %s", ErrPartsDisagree, r, h.Node, p.Node)
			}
			holder[r] = p
		}
	}
	var missing []int
	for r, h := range holder {
		if h == nil {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return nil, missing, nil
	}
	// Parts in the order of their lowest rank: the first holds rank 0.
	var order []*PartManifest
	for _, h := range holder {
		if !slices.Contains(order, h) {
			order = append(order, h)
		}
	}
	first := order[0]
	m := &Manifest{
		Format: Format, RunID: own.RunID, ID: own.ID, Step: own.Step, Reason: first.Reason,
		Created: time.Now().UTC(), Source: first.Source, Metadata: first.Metadata,
	}
	for _, p := range order {
		info := PartInfo{Node: p.Node, Ranks: p.Ranks, Files: len(p.Files)}
		for _, f := range p.Files {
			info.Bytes += f.Size
		}
		m.Files = append(m.Files, p.Files...)
		m.Parts = append(m.Parts, info)
	}
	if err := m.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrPartsDisagree, err)
	}
	return m, nil, nil
}

// PartCleanup is what an agent in part mode passes to cloud.Cleaner: it
// removes only the leftovers of its own part's uploads (keys under
// checkpoints/<dir>/<node>/), and anyone's older than a day. The other
// agents of the job may have uploads in flight under their own parts.
func PartCleanup(node string) cloud.CleanupOptions {
	return cloud.CleanupOptions{Owned: func(key string) bool {
		rest, ok := strings.CutPrefix(key, prefixDir)
		if !ok {
			return false
		}
		_, rest, ok = strings.Cut(rest, "/")
		return ok && strings.HasPrefix(rest, node+"/")
	}}
}

// ErrNoPart means the newest checkpoint of a job has no part of the node
// restoring it: restore fails rather than hand that node another node's
// files.
var ErrNoPart = errors.New("no part for this node:")

// ErrPathClash means two parts of a job checkpoint hold different files
// at one path, so they cannot be restored into one directory: restore one
// part at a time (RestoreOptions.Part).
var ErrPathClash = errors.New("parts hold different files at one path")

// selectFiles returns the manifest restore fetches for part ("": every
// part) and the parts it holds. Every part into one directory: a path in
// several parts must be the same file in each (it is fetched once).
func selectFiles(m *Manifest, part string, log *zap.Logger) (*Manifest, []string, error) {
	if len(m.Parts) == 0 {
		if part != "" {
			log.Warn("checkpoint has no parts: restoring all of it", zap.String("id", m.ID), zap.String("part", part))
		}
		return m, nil, nil
	}
	view := *m
	view.Files = nil
	var parts []string
	if part != "" {
		if m.Part(part) == nil {
			// Another node's files are not this node's state: resuming
			// from them would mix ranks. A changed topology restores
			// every part on purpose (RestoreOptions.Part "").
			var have []string
			for _, p := range m.Parts {
				have = append(have, p.Node)
			}
			return nil, nil, fmt.Errorf("checkpoint %d-%s has parts %v: %w %s (to restore every part, as after a change of topology, use --restore all)",
				m.Step, m.ID, have, ErrNoPart, part)
		}
		parts = []string{part}
	}
	byPath := map[string]File{}
	for _, f := range m.Files {
		if part != "" && f.Part != part {
			continue
		}
		if prev, ok := byPath[f.Path]; ok {
			if !prev.sameContent(f) {
				return nil, nil, fmt.Errorf("%q in parts %s and %s: %w", f.Path, prev.Part, f.Part, ErrPathClash)
			}
			continue
		}
		byPath[f.Path] = f
		view.Files = append(view.Files, f)
	}
	if part == "" {
		for _, p := range m.Parts {
			parts = append(parts, p.Node)
		}
	}
	// One directory: a path that is another part's directory cannot be laid out.
	flat := make([]File, len(view.Files))
	for i, f := range view.Files {
		flat[i] = f
		flat[i].Part = ""
	}
	if err := validateFiles(flat); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrPathClash, err)
	}
	return &view, parts, nil
}

// checkParts makes sure every object of m that restore does not fetch
// (view lists those it does, and verifies them as it goes) exists with its
// size: a job checkpoint with a part missing or cut short is not complete.
// Such a checkpoint is ErrCorrupt or cloud.ErrNotExist, as a damaged one.
func checkParts(ctx context.Context, st cloud.Store, m, view *Manifest) error {
	fetched := map[string]bool{}
	for _, f := range view.Files {
		fetched[f.Key] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, f := range m.Files {
		if fetched[f.Key] {
			continue
		}
		g.Go(func() error {
			info, err := st.Stat(gctx, f.Key)
			if err != nil {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, err)
			}
			if info.Size != f.Size {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, sizeMismatch(info.Size, f.Size))
			}
			return nil
		})
	}
	return g.Wait()
}
