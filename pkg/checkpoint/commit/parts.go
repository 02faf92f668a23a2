package commit

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
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// ErrIncomplete means a job checkpoint's parts did not all arrive before
// the commit's context ended: no manifest, nothing restorable.
var ErrIncomplete = errors.New("checkpoint incomplete")

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
	p := checkpoint.PartPrefix(step, id, node)
	if c.Session != "" {
		p += c.Session + "/"
	}
	return p
}

// pipelineFits reports whether pl uploads under the part node of checkpoint
// id (at any step: a done may report another step than expected).
func pipelineFits(pl *Pipeline, id string, part *checkpoint.PartSpec) bool {
	if part == nil {
		return true
	}
	_, rest, ok := strings.Cut(pl.prefix, "-"+id+"/")
	return ok && rest == strings.TrimPrefix(pl.c.partPrefix(0, id, part.Node), checkpoint.Prefix(0, id))
}

// commitPart writes this node's part manifest (its data is durable), waits
// for the other parts and commits the job manifest once they cover every
// rank. unslot frees the commit's upload slot: waiting for other nodes
// must not hold it.
func (c *Committer) commitPart(ctx context.Context, log *zap.Logger, req Request, m *checkpoint.Manifest, unslot func()) (*checkpoint.Manifest, error) {
	for i := range m.Files {
		m.Files[i].Part = req.Part.Node
	}
	own := &checkpoint.PartManifest{
		Format: checkpoint.PartFormat, RunID: c.RunID, ID: req.ID, Step: req.Step, Reason: req.Reason,
		Node: req.Part.Node, Ranks: slices.Sorted(slices.Values(req.Part.Ranks)), WorldSize: req.Part.WorldSize,
		Created: m.Created, Source: m.Source, Metadata: m.Metadata, Files: m.Files,
	}
	body, err := json.MarshalIndent(own, "", "  ")
	if err != nil {
		return nil, err
	}
	key := checkpoint.PartKey(req.Step, req.ID, req.Part.Node)
	if c.PartLease != nil {
		// A newer copy of this node exists: its parts are the node's.
		if err := c.PartLease.Check(ctx); err != nil {
			return nil, fmt.Errorf("write part: %w", err)
		}
	}
	if err := checkpoint.PutOnce(ctx, c.Store, key, body); err != nil {
		if errors.Is(err, cloud.ErrPrecondition) {
			return nil, fmt.Errorf("write part: %s exists, written by another agent: %w", key, checkpoint.ErrPartsDisagree)
		}
		if req.Pipeline != nil && !c.absent(key) {
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
	job, theirs, err := c.awaitParts(ctx, log, own)
	if err != nil {
		return nil, err
	}
	mkey := checkpoint.ManifestKey(req.Step, req.ID)
	if theirs {
		log.Info("another agent wrote the job manifest", zap.String("manifest", mkey))
		return job, nil
	}
	body, err = marshalManifest(job)
	if err != nil {
		return nil, err
	}
	err = c.Store.Put(ctx, mkey, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{IfAbsent: true})
	if errors.Is(err, cloud.ErrPrecondition) {
		// Another node finished first (or a retried write of ours landed):
		// its manifest stands if it names this checkpoint and this part.
		won, rerr := checkpoint.ReadManifest(ctx, c.Store, mkey)
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

// absent reports whether the manifest (or part manifest) key is known not to exist,
// asked with a short context of its own (the commit's may have ended):
// false when it exists or the store cannot say.
func (c *Committer) absent(key string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Store.Stat(ctx, key)
	return errors.Is(err, cloud.ErrNotExist)
}

// sameCheckpoint checks that m is the job manifest own belongs to: same
// id and step, and own's files in it as own lists them.
func sameCheckpoint(m *checkpoint.Manifest, own *checkpoint.PartManifest) error {
	if m.ID != own.ID || m.Step != own.Step {
		return fmt.Errorf("names %d-%s, not %d-%s: %w", m.Step, m.ID, own.Step, own.ID, checkpoint.ErrPartsDisagree)
	}
	if m.Part(own.Node) == nil {
		return fmt.Errorf("lacks part %s: %w", own.Node, checkpoint.ErrPartsDisagree)
	}
	have := map[string]checkpoint.File{}
	for _, f := range m.Files {
		if f.Part == own.Node {
			have[f.Path] = f
		}
	}
	for _, f := range own.Files {
		if have[f.Path] != f {
			return fmt.Errorf("lists part %s's file %q otherwise: %w", own.Node, f.Path, checkpoint.ErrPartsDisagree)
		}
	}
	return nil
}

// partsSleep is awaitParts' back-off between listings; the simulation
// (sim_test.go) makes it a step of its schedule instead of a real wait.
var partsSleep = retry.Sleep

// awaitParts waits (polls of 100 ms, doubling to 1 s) for the job manifest
// of own's checkpoint. The part holding rank 0 assembles it: it reads the
// other parts as they are listed until they cover every rank of own's world
// exactly once, and returns the job manifest they make (theirs false: its
// caller writes it). Every other part's agent reads only the manifest key
// (and lists parts/, no reads) and returns the manifest once it is there
// and names own as own does (theirs true): at 1,000 nodes a commit costs
// ~10³ part reads, not 10⁶ (each agent reading every part). When the
// listing has not changed for assembleAfter and there is still no
// manifest (rank 0's agent is gone, stalled, or found the parts
// disagree), it assembles too: the manifest's IfAbsent write lets one win.
// ctx ending first: ErrIncomplete.
//
// From partsWarnAfter on it says so (a warning naming the missing ranks and
// the time left, then one a minute), and gives up at once when no other
// node's agent ever took part in the run (checkOtherNodes).
func (c *Committer) awaitParts(ctx context.Context, log *zap.Logger, own *checkpoint.PartManifest) (job *checkpoint.Manifest, theirs bool, err error) {
	cache := map[string]*checkpoint.PartManifest{checkpoint.PartKey(own.Step, own.ID, own.Node): own}
	_, missing, _ := joinParts(own, []*checkpoint.PartManifest{own}) // until the first listing
	start, warnAt := time.Now(), partsWarnAfter
	w := manifestWatch{assembles: slices.Contains(own.Ranks, 0), since: start}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if waited := time.Since(start); waited >= warnAt && ctx.Err() == nil {
			warnAt = waited + time.Minute
			if err := c.checkOtherNodes(ctx, log, own, missing, waited); err != nil {
				return nil, false, err
			}
		}
		if !w.assembles {
			m, err := w.poll(ctx, c.Store, own)
			switch {
			case m != nil || err != nil:
				return m, true, err
			case w.assembles:
				log.Info("no job manifest yet and no new part for a while: assembling it here too",
					zap.String("id", own.ID), zap.Int64("step", own.Step), zap.Int("parts_listed", w.listed), zap.Float64("waited_s", time.Since(start).Seconds()))
			}
		}
		if w.assembles {
			parts, err := readParts(ctx, c.Store, own.Step, own.ID, cache)
			switch {
			case err == nil:
				m, miss, err := joinParts(own, parts)
				if err != nil || m != nil {
					return m, false, err
				}
				missing = miss
			case errors.Is(err, checkpoint.ErrPartsDisagree):
				return nil, false, err
			case ctx.Err() == nil:
				log.Warn("could not read the other parts, retrying", zap.Error(err))
			}
		}
		if partsSleep(ctx, wait) != nil {
			return nil, false, fmt.Errorf("%w: ranks %v of %d never committed their part (%w)", ErrIncomplete, missing, own.WorldSize, context.Cause(ctx))
		}
	}
}

// assembleAfter is how long an agent whose part lacks rank 0 waits for the
// job manifest with the parts' listing unchanged before it assembles the
// manifest itself: rank 0's agent writes it within a poll or two of the
// last part.
var assembleAfter = 5 * time.Second

// manifestWatch is a non-assembling agent's wait for the job manifest.
type manifestWatch struct {
	assembles bool      // this agent reads the parts (rank 0's, or the wait ran out)
	listed    int       // parts in the last listing
	since     time.Time // when the listing last changed
}

// poll returns the job manifest once it is there and names own as own
// does. While it is absent (or unreadable: read again at the next poll)
// poll lists the parts, and a listing unchanged for assembleAfter sets
// assembles.
func (w *manifestWatch) poll(ctx context.Context, st cloud.Store, own *checkpoint.PartManifest) (*checkpoint.Manifest, error) {
	mkey := checkpoint.ManifestKey(own.Step, own.ID)
	m, err := checkpoint.ReadManifest(ctx, st, mkey)
	if err == nil {
		if err := sameCheckpoint(m, own); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", mkey, err)
		}
		return m, nil
	}
	if keys, err := listParts(ctx, st, own.Step, own.ID); err == nil && len(keys) != w.listed {
		w.listed, w.since = len(keys), time.Now()
	}
	if time.Since(w.since) >= assembleAfter {
		w.assembles = true
	}
	return nil, nil
}

// partsWarnAfter is how long awaitParts waits for the other parts before
// it says so: other nodes' parts come within a second or two of this one
// when their ranks save together.
var partsWarnAfter = 10 * time.Second

// checkOtherNodes warns that the job checkpoint is still waiting for the
// ranks missing, and fails it (ErrIncomplete) when no other node's agent
// ever took a part lease of this run: nobody will write their part (a node
// runs its trainer without spotagent, or without --node-rank).
func (c *Committer) checkOtherNodes(ctx context.Context, log *zap.Logger, own *checkpoint.PartManifest, missing []int, waited time.Duration) error {
	others := map[string]bool{}
	err := c.Store.List(ctx, checkpoint.LeaseDir, func(o cloud.ObjectInfo) error {
		if node, _, ok := strings.Cut(strings.TrimPrefix(o.Key, checkpoint.LeaseDir), "/"); ok && node != own.Node {
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
// manifests not in cache (they are written once: a read is final), up to
// partReads at once: at 1,000 nodes the assembling agent reads 999 of them.
func readParts(ctx context.Context, st cloud.Store, step int64, id string, cache map[string]*checkpoint.PartManifest) ([]*checkpoint.PartManifest, error) {
	keys, err := listParts(ctx, st, step, id)
	if err != nil {
		return nil, err
	}
	read := make([]*checkpoint.PartManifest, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(partReads)
	for i, k := range keys {
		if cache[k] != nil {
			continue
		}
		g.Go(func() error {
			p, err := checkpoint.ReadPart(gctx, st, k)
			if errors.Is(err, cloud.ErrNotExist) {
				return nil // deleted since the listing (retention)
			}
			read[i] = p
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var parts []*checkpoint.PartManifest
	for i, k := range keys {
		if read[i] != nil {
			cache[k] = read[i]
		}
		if p := cache[k]; p != nil {
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// listParts lists the part manifests' keys of checkpoint (step, id).
func listParts(ctx context.Context, st cloud.Store, step int64, id string) ([]string, error) {
	dir := checkpoint.Prefix(step, id) + checkpoint.PartsDir
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
	return keys, nil
}

// partReads is how many part manifests readParts reads at once.
const partReads = 16

// joinParts returns the job manifest the parts make once their ranks cover
// own's world exactly once, or the ranks still missing. Parts that cannot
// make one checkpoint are ErrPartsDisagree.
func joinParts(own *checkpoint.PartManifest, parts []*checkpoint.PartManifest) (*checkpoint.Manifest, []int, error) {
	holder := make([]*checkpoint.PartManifest, own.WorldSize)
	for _, p := range parts {
		if p.WorldSize != own.WorldSize || p.RunID != own.RunID {
			return nil, nil, fmt.Errorf("%w: part %s has run %q world size %d, part %s run %q world size %d",
				checkpoint.ErrPartsDisagree, p.Node, p.RunID, p.WorldSize, own.Node, own.RunID, own.WorldSize)
		}
		for _, r := range p.Ranks {
			if h := holder[r]; h != nil {
				return nil, nil, fmt.Errorf("%w: rank %d claimed by parts %s and %s", checkpoint.ErrPartsDisagree, r, h.Node, p.Node)
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
	var order []*checkpoint.PartManifest
	for _, h := range holder {
		if !slices.Contains(order, h) {
			order = append(order, h)
		}
	}
	first := order[0]
	m := &checkpoint.Manifest{
		Format: checkpoint.Format, RunID: own.RunID, ID: own.ID, Step: own.Step, Reason: first.Reason,
		Created: time.Now().UTC(), Source: first.Source, Metadata: first.Metadata,
	}
	for _, p := range order {
		info := checkpoint.PartInfo{Node: p.Node, Ranks: p.Ranks, Files: len(p.Files)}
		if p.Source != (checkpoint.Machine{}) {
			info.Source = &p.Source
		}
		for _, f := range p.Files {
			info.Bytes += f.Size
		}
		m.Files = append(m.Files, p.Files...)
		m.Parts = append(m.Parts, info)
	}
	if err := m.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", checkpoint.ErrPartsDisagree, err)
	}
	return m, nil, nil
}
